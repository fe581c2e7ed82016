// Running the containers of chosen images as processes on this machine, so that a real kubelet
// runs a Helm chart's own pods (the gpusched components, kube-scheduler) with nothing faked
// above the container runtime: the kubelet resolves their environment, projects their
// ServiceAccount tokens, materialises their ConfigMaps and Secrets, probes their ports and
// restarts them; this runtime only starts the command.
//
// Each pod gets a network namespace of its own, on a bridge the harness creates: containers of
// one pod share its loopback (kube-scheduler reaches its extender on 127.0.0.1), pods on one
// machine do not collide on ports, and the kubelet probes each pod at its own address. Each
// container gets a mount namespace of its own, copied from the kubelet's (where its
// /var/lib/kubelet and the tmpfs of each Secret and token volume are), in which the kubelet's
// mounts sit at their container paths. The apiserver's Service address is translated to the
// bridge's gateway, where the local API server listens (no kube-proxy runs here).
//
// Not isolated: the root filesystem, users and capabilities are the host's (securityContext is
// not applied), and mount points a container needs are created on the host if missing.
package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// processConfig is what the harness tells the runtime about this node.
type processConfig struct {
	images      *regexp.Regexp // containers of matching images run as processes
	path        string         // PATH of those processes
	env         []string       // extra environment (the node's simulated hardware)
	kubeletRoot string         // where the kubelet's /var/lib/kubelet is on the host
	kubeletPid  string         // file holding the kubelet's pid: its mount namespace is the pods' view
	bridge      string         // bridge the pods' veths join
	gateway     string         // the bridge's address: the pods' default route and the API server
	subnet      string         // prefix of this node's pod addresses, e.g. "10.250.3."
	apiserver   string         // port of the API server on the gateway
	namePrefix  string         // prefix of this node's network namespaces
}

type podNetwork struct {
	netns string
	ip    string
}

type process struct {
	cmd     *exec.Cmd
	done    chan struct{}
	stopped bool
}

type processRuntime struct {
	config     processConfig
	mu         sync.Mutex
	next       int
	sandboxes  map[string]*podNetwork                 // sandbox id -> network
	logDirs    map[string]string                      // sandbox id -> log directory
	containers map[string]*runtimeapi.ContainerConfig // container id -> config (run as process)
	sandboxOf  map[string]string                      // container id -> sandbox id
	processes  map[string]*process
}

func newProcessRuntime(config processConfig) *processRuntime {
	return &processRuntime{
		config:     config,
		sandboxes:  map[string]*podNetwork{},
		logDirs:    map[string]string{},
		containers: map[string]*runtimeapi.ContainerConfig{},
		sandboxOf:  map[string]string{},
		processes:  map[string]*process{},
	}
}

func ipCommand(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sandboxCreated gives a new pod its network namespace; hostNetwork pods keep the host's.
func (p *processRuntime) sandboxCreated(id string, config *runtimeapi.PodSandboxConfig) (string, error) {
	p.mu.Lock()
	p.logDirs[id] = config.GetLogDirectory()
	if config.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE {
		p.mu.Unlock()
		return "", nil
	}
	if found, ok := p.sandboxes[id]; ok {
		p.mu.Unlock()
		return found.ip, nil
	}
	p.next++
	n := p.next
	p.mu.Unlock()
	if n > 250 {
		return "", fmt.Errorf("no pod address left on this node")
	}
	network := &podNetwork{netns: fmt.Sprintf("%s%d", p.config.namePrefix, n), ip: fmt.Sprintf("%s%d", p.config.subnet, n+1)}
	host := fmt.Sprintf("v%s%d", p.config.namePrefix, n)
	if len(host) > 15 {
		host = host[len(host)-15:]
	}
	steps := [][]string{
		{"netns", "add", network.netns},
		{"link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", network.netns},
		{"link", "set", host, "master", p.config.bridge},
		{"link", "set", host, "up"},
		{"-n", network.netns, "addr", "add", network.ip + "/16", "dev", "eth0"},
		{"-n", network.netns, "link", "set", "eth0", "up"},
		{"-n", network.netns, "link", "set", "lo", "up"},
		{"-n", network.netns, "route", "add", "default", "via", p.config.gateway},
	}
	for _, step := range steps {
		if err := ipCommand(step...); err != nil {
			_ = ipCommand("netns", "delete", network.netns)
			return "", err
		}
	}
	p.mu.Lock()
	p.sandboxes[id] = network
	p.mu.Unlock()
	return network.ip, nil
}

// sandboxRemoved deletes the pod's network namespace (its veth goes with it).
func (p *processRuntime) sandboxRemoved(id string) {
	p.mu.Lock()
	network := p.sandboxes[id]
	delete(p.sandboxes, id)
	p.mu.Unlock()
	if network != nil {
		if err := ipCommand("netns", "delete", network.netns); err != nil {
			log.Print(err)
		}
	}
}

// containerCreated remembers the config of a container to run as a process.
func (p *processRuntime) containerCreated(id, sandbox string, config *runtimeapi.ContainerConfig) {
	if !p.config.images.MatchString(config.GetImage().GetImage()) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.containers[id] = config
	p.sandboxOf[id] = sandbox
}

func (p *processRuntime) hostPath(path string) string {
	const kubeletDir = "/var/lib/kubelet"
	if path == kubeletDir || strings.HasPrefix(path, kubeletDir+"/") {
		return filepath.Join(p.config.kubeletRoot, strings.TrimPrefix(path, kubeletDir))
	}
	return path
}

// skipped mounts are files the kubelet manages for a real container's own root (hosts,
// hostname, resolv.conf, the termination log): here they would cover the host's.
func skipped(containerPath string) bool {
	switch containerPath {
	case "/etc/hosts", "/etc/hostname", "/etc/resolv.conf":
		return true
	}
	return strings.HasPrefix(containerPath, "/dev/")
}

const mountScript = `set -e
while [ "$1" != "--" ]; do
  source=$1; target=$2; mode=$3; shift 3
  if [ -d "$source" ]; then mkdir -p "$target"; else mkdir -p "$(dirname "$target")"; [ -e "$target" ] || : > "$target"; fi
  mount --rbind "$source" "$target"
  if [ "$mode" = ro ]; then mount -o remount,bind,ro "$target"; fi
done
shift
cd "$WORKDIR"
exec "$@"`

// started runs a container as a process if its image is one of ours; false otherwise.
func (p *processRuntime) started(id string, exited func(code int32, reason string)) (bool, error) {
	p.mu.Lock()
	config, ok := p.containers[id]
	network := p.sandboxes[p.sandboxOf[id]]
	logDir := p.logDirs[p.sandboxOf[id]]
	p.mu.Unlock()
	if !ok {
		return false, nil
	}
	argv := append(append([]string{}, config.GetCommand()...), config.GetArgs()...)
	if len(argv) == 0 {
		return true, fmt.Errorf("container %s has no command: an image's entrypoint is unknown here", config.GetMetadata().GetName())
	}
	script := []string{"sh", "-c", mountScript, "mounts"}
	for _, m := range config.GetMounts() {
		if skipped(m.GetContainerPath()) {
			continue
		}
		mode := "rw"
		if m.GetReadonly() {
			mode = "ro"
		}
		script = append(script, m.GetHostPath(), m.GetContainerPath(), mode)
	}
	script = append(script, "--")
	script = append(script, argv...)
	// The kubelet's mount namespace holds its view of /var/lib/kubelet and the tmpfs mounts of
	// the pods' Secrets and projected tokens: each container starts from a copy of it.
	pid, err := os.ReadFile(p.config.kubeletPid)
	if err != nil {
		return true, fmt.Errorf("the kubelet's pid: %w", err)
	}
	full := []string{"nsenter", "--mount=/proc/" + strings.TrimSpace(string(pid)) + "/ns/mnt"}
	if network != nil {
		full = append(full, "--net=/run/netns/"+network.netns)
	}
	full = append(full, "--", "unshare", "--mount", "--propagation", "private")
	full = append(full, script...)
	cmd := exec.Command(full[0], full[1:]...)
	cmd.Env = p.environment(config)
	workdir := config.GetWorkingDir()
	if workdir == "" {
		workdir = "/"
	}
	cmd.Env = append(cmd.Env, "WORKDIR="+workdir)
	output, err := openLog(p.hostPath(logDir), config.GetLogPath())
	if err != nil {
		return true, err
	}
	stdout, stderr := criLog(output, "stdout"), criLog(output, "stderr")
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		output.Close()
		return true, err
	}
	proc := &process{cmd: cmd, done: make(chan struct{})}
	p.mu.Lock()
	p.processes[id] = proc
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		stdout.Close()
		stderr.Close()
		output.Close()
		code, reason := int32(0), "Completed"
		if err != nil {
			code, reason = 1, "Error"
			if status, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
				if status.Signaled() {
					code = 128 + int32(status.Signal())
				} else {
					code = int32(status.ExitStatus())
				}
			}
		}
		close(proc.done)
		exited(code, reason)
	}()
	return true, nil
}

// environment is the container's, with the API server's Service address translated to the
// gateway and the node's extra variables.
func (p *processRuntime) environment(config *runtimeapi.ContainerConfig) []string {
	env := []string{"PATH=" + p.config.path}
	service := map[string]string{
		"KUBERNETES_SERVICE_HOST":       p.config.gateway,
		"KUBERNETES_SERVICE_PORT":       p.config.apiserver,
		"KUBERNETES_SERVICE_PORT_HTTPS": p.config.apiserver,
		"KUBERNETES_PORT":               "tcp://" + net.JoinHostPort(p.config.gateway, p.config.apiserver),
		"KUBERNETES_PORT_443_TCP":       "tcp://" + net.JoinHostPort(p.config.gateway, p.config.apiserver),
		"KUBERNETES_PORT_443_TCP_ADDR":  p.config.gateway,
		"KUBERNETES_PORT_443_TCP_PORT":  p.config.apiserver,
	}
	for _, kv := range config.GetEnvs() {
		if _, translated := service[kv.GetKey()]; translated || kv.GetKey() == "PATH" {
			continue
		}
		env = append(env, kv.GetKey()+"="+string(kv.GetValue()))
	}
	for key, value := range service {
		env = append(env, key+"="+value)
	}
	return append(env, p.config.env...)
}

// stopped ends a container's process: SIGTERM, then SIGKILL after the grace period.
func (p *processRuntime) stopped(id string, timeout int64) bool {
	p.mu.Lock()
	proc, ok := p.processes[id]
	p.mu.Unlock()
	if !ok {
		return false
	}
	_ = proc.cmd.Process.Signal(syscall.SIGTERM)
	if timeout < 1 {
		timeout = 1
	}
	select {
	case <-proc.done:
	case <-time.After(time.Duration(timeout) * time.Second):
		_ = proc.cmd.Process.Kill()
		<-proc.done
	}
	return true
}

func (p *processRuntime) removed(id string) {
	p.stopped(id, 1)
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.processes, id)
	delete(p.containers, id)
	delete(p.sandboxOf, id)
}

// shutdown stops every process and deletes every network namespace of this runtime.
func (p *processRuntime) shutdown() {
	p.mu.Lock()
	ids := make([]string, 0, len(p.processes))
	for id := range p.processes {
		ids = append(ids, id)
	}
	sandboxes := make([]string, 0, len(p.sandboxes))
	for id := range p.sandboxes {
		sandboxes = append(sandboxes, id)
	}
	p.mu.Unlock()
	for _, id := range ids {
		p.stopped(id, 2)
	}
	for _, id := range sandboxes {
		p.sandboxRemoved(id)
	}
}

func openLog(dir, path string) (*os.File, error) {
	if dir == "" || path == "" {
		return os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	}
	full := filepath.Join(dir, path)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return nil, err
	}
	return os.OpenFile(full, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
}

// criLog writes a stream in the CRI log format the kubelet reads (`kubectl logs` works).
func criLog(out io.Writer, stream string) io.WriteCloser {
	reader, writer := io.Pipe()
	var mu sync.Mutex
	go func() {
		scanner := bufio.NewScanner(reader)
		scanner.Buffer(make([]byte, 64*1024), 1024*1024)
		for scanner.Scan() {
			mu.Lock()
			fmt.Fprintf(out, "%s %s F %s\n", time.Now().UTC().Format(time.RFC3339Nano), stream, scanner.Text())
			mu.Unlock()
		}
	}()
	return writer
}

// processRunning is the recording runtime with containers of chosen images run as processes.
type processRunning struct {
	*recordingRuntime
	processes *processRuntime
}

func (r *processRunning) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	resp, err := r.recordingRuntime.RunPodSandbox(ctx, req)
	if err != nil {
		return resp, err
	}
	ip, err := r.processes.sandboxCreated(resp.GetPodSandboxId(), req.GetConfig())
	if err != nil {
		return nil, err
	}
	if ip != "" {
		fake := r.RuntimeService
		fake.Lock()
		if sandbox, ok := fake.Sandboxes[resp.GetPodSandboxId()]; ok {
			sandbox.Network = &runtimeapi.PodSandboxNetworkStatus{Ip: ip}
		}
		fake.Unlock()
	}
	return resp, nil
}

func (r *processRunning) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	r.processes.sandboxRemoved(req.GetPodSandboxId())
	return r.recordingRuntime.RemovePodSandbox(ctx, req)
}

func (r *processRunning) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	resp, err := r.recordingRuntime.CreateContainer(ctx, req)
	if err == nil {
		r.processes.containerCreated(resp.GetContainerId(), req.GetPodSandboxId(), req.GetConfig())
	}
	return resp, err
}

func (r *processRunning) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	resp, err := r.recordingRuntime.StartContainer(ctx, req)
	if err != nil {
		return resp, err
	}
	id := req.GetContainerId()
	_, err = r.processes.started(id, func(code int32, reason string) {
		fake := r.RuntimeService
		fake.Lock()
		defer fake.Unlock()
		if c, ok := fake.Containers[id]; ok && c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			c.State = runtimeapi.ContainerState_CONTAINER_EXITED
			c.FinishedAt = time.Now().UnixNano()
			c.ExitCode = code
			c.Reason = reason
		}
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (r *processRunning) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	r.processes.stopped(req.GetContainerId(), req.GetTimeout())
	return r.recordingRuntime.StopContainer(ctx, req)
}

func (r *processRunning) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	r.processes.removed(req.GetContainerId())
	return r.recordingRuntime.RemoveContainer(ctx, req)
}
