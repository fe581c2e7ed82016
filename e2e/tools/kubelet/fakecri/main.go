// Command fakecri serves the container runtime interface (runtime and image services) on a
// unix socket with the fake runtime of k8s.io/cri-client, so that a real kubelet runs pods on a
// machine without a container runtime: sandboxes and containers exist only in this process's
// memory, and a container is "running" once started; with --run-images, containers of matching
// images run as processes in network namespaces of their pods (processes.go).
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
	"regexp"
	"sort"
	"strings"
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

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	endpoint := flag.String("endpoint", "", "unix socket to serve on, e.g. unix:///tmp/cri.sock")
	record := flag.String("record", "", "append every CreateContainer request to this file (JSON lines)")
	runImages := flag.String("run-images", "", "run containers whose image matches this regular expression as processes (processes.go)")
	path := flag.String("path", os.Getenv("PATH"), "PATH of the processes")
	var env stringList
	flag.Var(&env, "env", "KEY=VALUE added to every process (repeatable)")
	kubeletRoot := flag.String("kubelet-root", "", "host directory the kubelet's /var/lib/kubelet is bind-mounted from")
	kubeletPid := flag.String("kubelet-pid-file", "", "file holding the kubelet's pid (its mount namespace)")
	bridge := flag.String("bridge", "", "bridge the pods' network namespaces join")
	gateway := flag.String("gateway", "", "address of the bridge: the pods' default route and the API server's")
	subnet := flag.String("subnet", "", "prefix of this node's pod addresses, e.g. 10.250.3.")
	apiserverPort := flag.String("apiserver-port", "", "port of the API server on the gateway")
	netnsPrefix := flag.String("netns-prefix", "gs", "prefix of this node's network namespace names")
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
	// "Pulled" images get a size: the kubelet refuses an image of size 0 when a pod's pull
	// policy (IfNotPresent, a tagged image) makes it look at the image before starting it.
	runtime.ImageService.FakeImageSize = 1
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
	var processes *processRuntime
	if *runImages != "" {
		images, err := regexp.Compile(*runImages)
		if err != nil {
			log.Fatalf("--run-images: %v", err)
		}
		processes = newProcessRuntime(processConfig{
			images:      images,
			path:        *path,
			env:         env,
			kubeletRoot: *kubeletRoot,
			kubeletPid:  *kubeletPid,
			bridge:      *bridge,
			gateway:     *gateway,
			subnet:      *subnet,
			apiserver:   *apiserverPort,
			namePrefix:  *netnsPrefix,
		})
		runtimeapi.RegisterRuntimeServiceServer(server, &processRunning{runtime, processes})
	} else {
		runtimeapi.RegisterRuntimeServiceServer(server, runtime)
	}
	runtimeapi.RegisterImageServiceServer(server, runtime.RemoteRuntime)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		if processes != nil {
			processes.shutdown()
		}
		server.Stop()
	}()
	log.Printf("fake CRI serving on %s", *endpoint)
	if err := server.Serve(listener); err != nil {
		log.Fatal(err)
	}
}
