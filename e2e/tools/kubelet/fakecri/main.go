// Command fakecri serves the container runtime interface (runtime and image services) on a
// unix socket with the fake runtime of k8s.io/cri-client, so that a real kubelet runs pods on a
// machine without a container runtime: sandboxes and containers exist only in this process's
// memory, and a container is "running" once started.
//
// Every CreateContainer request is appended as one JSON line to --record: the pod, the container
// and the devices, CDI device names, environment and annotations the kubelet asked the runtime
// to give it. Tests read it to see what a container really received.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// recordingRuntime is the fake runtime with CreateContainer requests written to a file.
type recordingRuntime struct {
	*fake.RemoteRuntime
	mu     sync.Mutex
	record *os.File
}

// createdContainer is one line of the record file.
type createdContainer struct {
	Namespace   string            `json:"namespace"`
	Pod         string            `json:"pod"`
	PodUID      string            `json:"podUID"`
	Container   string            `json:"container"`
	Attempt     uint32            `json:"attempt"`
	Envs        map[string]string `json:"envs"`
	CDIDevices  []string          `json:"cdiDevices"`
	Devices     []string          `json:"devices"`
	Annotations map[string]string `json:"annotations"`
}

func (r *recordingRuntime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil || r.record == nil {
		return resp, err
	}
	config, sandbox := req.GetConfig(), req.GetSandboxConfig().GetMetadata()
	line := createdContainer{
		Namespace:   sandbox.GetNamespace(),
		Pod:         sandbox.GetName(),
		PodUID:      sandbox.GetUid(),
		Container:   config.GetMetadata().GetName(),
		Attempt:     config.GetMetadata().GetAttempt(),
		Envs:        map[string]string{},
		CDIDevices:  []string{},
		Devices:     []string{},
		Annotations: config.GetAnnotations(),
	}
	for _, env := range config.GetEnvs() {
		line.Envs[env.GetKey()] = string(env.GetValue())
	}
	for _, device := range config.GetCDIDevices() {
		line.CDIDevices = append(line.CDIDevices, device.GetName())
	}
	for _, device := range config.GetDevices() {
		line.Devices = append(line.Devices, device.GetHostPath())
	}
	sort.Strings(line.Devices)
	encoded, err := json.Marshal(line)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.record.Write(append(encoded, '\n')); err != nil {
		return nil, err
	}
	return resp, nil
}

func main() {
	endpoint := flag.String("endpoint", "", "unix socket to serve on, e.g. unix:///tmp/cri.sock")
	record := flag.String("record", "", "append every CreateContainer request to this file (JSON lines)")
	flag.Parse()
	if *endpoint == "" {
		log.Fatal("--endpoint is required")
	}
	runtime := &recordingRuntime{RemoteRuntime: fake.NewFakeRemoteRuntime()}
	if *record != "" {
		file, err := os.OpenFile(*record, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			log.Fatal(err)
		}
		runtime.record = file
	}
	runtime.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{
		Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			{Type: runtimeapi.NetworkReady, Status: true},
		},
	}
	listener, err := util.CreateListener(*endpoint)
	if err != nil {
		log.Fatalf("listening on %s: %v", *endpoint, err)
	}
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, runtime)
	runtimeapi.RegisterImageServiceServer(server, runtime.RemoteRuntime)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	log.Printf("fake CRI serving on %s", *endpoint)
	if err := server.Serve(listener); err != nil {
		log.Fatal(err)
	}
}
