package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// The scale measurement's switches: KAIRON_SCALE_BENCH=1 runs it (make
// bench-scale); the sizes default to the issue's.
const (
	scaleBenchEnv = "KAIRON_SCALE_BENCH"
	// KAIRON_SCALE_SIZES=machines,nodes,pools,claims
	scaleSizesEnv = "KAIRON_SCALE_SIZES"
)

// TestScaleBench measures Kairon's control plane at scale on kairon-local:
// hollow nodes (bin/kairon-node --backend sim, no VMs), warm pools holding
// every Machine, then a claim storm during which bin/kairon-controller is
// killed (SIGKILL) and started again. It prints, per phase, the
// controller's CPU time and resident memory, the API server's request
// rate, and the times to converge; it fails only if a claim is lost or
// bound twice.
//
//	KAIRON_SCALE_BENCH=1 KAIRON_BIN_DIR=$PWD/bin go test -count=1 -timeout 120m -run TestScaleBench -v ./test/e2e/
func TestScaleBench(t *testing.T) {
	if os.Getenv(scaleBenchEnv) == "" {
		t.Skipf("a measurement; set %s=1 (make bench-scale)", scaleBenchEnv)
	}
	machines, nodes, pools, claims := 5000, 50, 20, 2000
	if s := os.Getenv(scaleSizesEnv); s != "" {
		var err error
		if _, err = fmt.Sscanf(s, "%d,%d,%d,%d", &machines, &nodes, &pools, &claims); err != nil || nodes < 1 || pools < 1 || machines < pools || claims > machines {
			t.Fatalf("%s=%q: want machines,nodes,pools,claims (claims at most machines): %v", scaleSizesEnv, s, err)
		}
	}
	t.Logf("load average before: %s", loadAvg())
	t.Cleanup(func() { t.Logf("load average after: %s", loadAvg()) })
	cb := newClaimBench(t)
	env := cb.env()
	ctx := context.Background()

	// Room for every member and every replacement, so that capacity never
	// decides anything; a /16 per node, so that addresses do not either.
	began := time.Now()
	var agents []int
	for i := range nodes {
		// kairon-node's default tick (5 s), not the tests' 2 s: every agent
		// re-checks each of its Machines every tick.
		agents = append(agents, startSimAgent(t, env, fmt.Sprintf("scale-%02d", i), fmt.Sprintf("10.%d.0.0/16", 100+i), 4000, "4000Gi", "--interval", "5s").cmd.Process.Pid)
	}
	for i := range nodes {
		waitNodeReady(t, env, fmt.Sprintf("scale-%02d", i))
	}
	t.Logf("%d hollow nodes Ready in %s", nodes, time.Since(began).Round(time.Millisecond))
	ctrl := startScaleController(t, env)
	api := apiServerPID(t, cb.local.dataDir)
	others := map[string][]int{"kairon-node agents": agents, "etcd": {controlPlanePID(t, "etcd", cb.local.dataDir)}}

	// Phase 1: the pools warm up.
	phase := newScalePhase(t, cb, ctrl, api, others, "warm-up")
	for p := range pools {
		n := machines / pools
		if p < machines%pools {
			n++
		}
		pool := &kaironv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: cb.ns, Name: fmt.Sprintf("pool-%02d", p)},
			Spec: kaironv1.MachinePoolSpec{Replicas: ptr.To(int32(n))}}
		if err := cb.c.Create(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	warm := func() (int, string) {
		var list kaironv1.MachinePoolList
		if err := cb.c.List(ctx, &list, client.InNamespace(cb.ns)); err != nil {
			return 0, err.Error()
		}
		ready := 0
		for _, p := range list.Items {
			ready += int(p.Status.ReadyWarm)
		}
		return ready, fmt.Sprintf("%d of %d Running warm", ready, machines)
	}
	testenv.Eventually(t, 90*time.Minute, fmt.Sprintf("%d warm members Running", machines), func() (bool, string) {
		n, saw := warm()
		return n == machines, saw
	})
	phase.end(machines, "Machines Running")

	// Phase 2: the claim storm, with a controller restart a third of the
	// way through.
	history := watchScaleBinds(t, cb)
	phase = newScalePhase(t, cb, ctrl, api, others, "claim storm")
	stormStart := time.Now()
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < claims; i += 16 {
				c := &kaironv1.MachineClaim{
					ObjectMeta: metav1.ObjectMeta{Namespace: cb.ns, Name: fmt.Sprintf("storm-%04d", i)},
					Spec:       kaironv1.MachineClaimSpec{PoolName: fmt.Sprintf("pool-%02d", i%pools)},
				}
				if err := cb.c.Create(ctx, c); err != nil {
					t.Errorf("creating claim %s: %v", c.Name, err)
				}
			}
		})
	}
	testenv.Eventually(t, 60*time.Minute, "a third of the claims bound", func() (bool, string) {
		n := history.boundCount()
		return n >= claims/3, fmt.Sprintf("%d bound", n)
	})
	before := phase.stopController()
	atKill := history.boundCount()
	restart := time.Now()
	ctrl = startScaleController(t, env)
	phase.ctrl = ctrl
	t.Logf("controller killed at %s into the storm with %d/%d claims bound (it had used %.1f s of CPU, peak RSS %.0f MiB)",
		restart.Sub(stormStart).Round(time.Millisecond), atKill, claims, before.cpu, before.peakMiB)
	wg.Wait()
	testenv.Eventually(t, 60*time.Minute, "every claim bound", func() (bool, string) {
		n := history.boundCount()
		return n == claims, fmt.Sprintf("%d/%d bound", n, claims)
	})
	converged := time.Since(restart)
	phase.end(claims, "claims Bound")
	t.Logf("after the restart: every claim Bound %s later (%d were left); the whole storm took %s",
		converged.Round(time.Millisecond), claims-atKill, time.Since(stormStart).Round(time.Millisecond))
	history.check(t, claims)
}

// scaleController is a bin/kairon-controller process of the measurement.
type scaleController struct {
	cmd *exec.Cmd
	log string
}

func startScaleController(t *testing.T, env *testenv.Env) *scaleController {
	t.Helper()
	log := filepath.Join(t.TempDir(), "controller.log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(filepath.Join(env.BinDir, "kairon-controller"),
		"-kubeconfig", env.Kubeconfig, "-metrics-bind-address", "0", "-health-probe-bind-address", "0")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &scaleController{cmd: cmd, log: log}
	t.Cleanup(func() { c.kill() })
	return c
}

func (c *scaleController) kill() {
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		_ = c.cmd.Wait()
	}
}

// procUsage is a process's CPU seconds (user + system) and peak RSS.
type procUsage struct {
	cpu     float64
	peakMiB float64
	rssMiB  float64
}

func usageOf(pid int) procUsage {
	var u procUsage
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		if i := bytes.LastIndexByte(stat, ')'); i > 0 {
			f := strings.Fields(string(stat[i+2:]))
			if len(f) > 12 {
				ut, _ := strconv.ParseFloat(f[11], 64)
				st, _ := strconv.ParseFloat(f[12], 64)
				u.cpu = (ut + st) / 100 // USER_HZ
			}
		}
	}
	if status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(status), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			kb, _ := strconv.ParseFloat(f[1], 64)
			switch f[0] {
			case "VmHWM:":
				u.peakMiB = kb / 1024
			case "VmRSS:":
				u.rssMiB = kb / 1024
			}
		}
	}
	return u
}

// apiServerPID finds the kube-apiserver kairon-local started for dataDir.
func apiServerPID(t *testing.T, dataDir string) int {
	t.Helper()
	return controlPlanePID(t, "kube-apiserver", dataDir)
}

// controlPlanePID finds the process named name that kairon-local started
// for dataDir.
func controlPlanePID(t *testing.T, name, dataDir string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == name && strings.Contains(string(cmdline), dataDir) {
			return pid
		}
	}
	t.Fatalf("no %s of %s found", name, dataDir)
	return 0
}

// scalePhase measures one phase: from its start to end, the controller's
// and the API server's CPU time and memory, and the API requests served.
type scalePhase struct {
	t        *testing.T
	cb       *claimBench
	name     string
	ctrl     *scaleController
	api      int
	start    time.Time
	requests map[string]float64
	apiCPU   float64
	// ctrlCPU is what controllers killed during the phase used.
	ctrlCPU  float64
	ctrlPeak float64
	// others are the rest of the machine's work, by what it is: the
	// hollow node agents and etcd, whose CPU takes from the two above.
	others    map[string][]int
	othersCPU map[string]float64
}

func newScalePhase(t *testing.T, cb *claimBench, ctrl *scaleController, api int, others map[string][]int, name string) *scalePhase {
	p := &scalePhase{t: t, cb: cb, name: name, ctrl: ctrl, api: api, start: time.Now(),
		requests: apiRequests(cb), apiCPU: usageOf(api).cpu, ctrlCPU: -usageOf(ctrl.cmd.Process.Pid).cpu,
		others: others, othersCPU: map[string]float64{}}
	for what, pids := range others {
		p.othersCPU[what] = cpuOf(pids)
	}
	return p
}

// cpuOf is the CPU seconds pids used together.
func cpuOf(pids []int) float64 {
	var total float64
	for _, pid := range pids {
		total += usageOf(pid).cpu
	}
	return total
}

// stopController kills the phase's controller (SIGKILL) and books what it
// used.
func (p *scalePhase) stopController() procUsage {
	u := usageOf(p.ctrl.cmd.Process.Pid)
	p.ctrlCPU += u.cpu
	p.ctrlPeak = max(p.ctrlPeak, u.peakMiB)
	p.ctrl.kill()
	return u
}

func (p *scalePhase) end(items int, what string) {
	took := time.Since(p.start)
	u := usageOf(p.ctrl.cmd.Process.Pid)
	ctrlCPU := p.ctrlCPU + u.cpu
	api := usageOf(p.api)
	requests, kinds := testenv.RequestsSince(p.requests, apiRequests(p.cb), items, 10)
	p.t.Logf("phase %s: %d %s in %s (%.1f/s); kairon-controller %.1f s CPU (%.0f%% of a core), RSS %.0f MiB now, peak %.0f MiB; "+
		"kube-apiserver %.1f s CPU, RSS %.0f MiB; %.0f API requests (%.0f/s, %.1f per item); load %s",
		p.name, items, what, took.Round(time.Millisecond), float64(items)/took.Seconds(),
		ctrlCPU, 100*ctrlCPU/took.Seconds(), u.rssMiB, max(p.ctrlPeak, u.peakMiB),
		api.cpu-p.apiCPU, api.rssMiB, requests, requests/took.Seconds(), requests/float64(items), loadAvg())
	p.t.Logf("phase %s: API requests per item, largest kinds: %s", p.name, kinds)
	var rest []string
	for what, pids := range p.others {
		cpu := cpuOf(pids) - p.othersCPU[what]
		rest = append(rest, fmt.Sprintf("%s %.1f s (%.0f%% of a core)", what, cpu, 100*cpu/took.Seconds()))
	}
	sort.Strings(rest)
	p.t.Logf("phase %s: CPU of the rest: %s", p.name, strings.Join(rest, ", "))
}

// apiRequests is the API server's apiserver_request_total, every verb, by
// verb and resource (subresource after a slash).
func apiRequests(cb *claimBench) map[string]float64 {
	out, err := testenv.APIRequests(context.Background(), cb.cs.Discovery().RESTClient(), nil)
	if err != nil {
		cb.t.Fatal(err)
	}
	return out
}

// scaleBinds follows every claim's status.machineName over the storm.
type scaleBinds struct {
	mu        sync.Mutex
	byClaim   map[string]map[string]bool
	byMachine map[string]map[string]bool
}

func watchScaleBinds(t *testing.T, cb *claimBench) *scaleBinds {
	h := &scaleBinds{byClaim: map[string]map[string]bool{}, byMachine: map[string]map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		rv := ""
		for ctx.Err() == nil {
			w, err := cb.c.Watch(ctx, &kaironv1.MachineClaimList{}, client.InNamespace(cb.ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
			if err != nil {
				rv = "" // start again from the current state
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			for ev := range w.ResultChan() {
				c, ok := ev.Object.(*kaironv1.MachineClaim)
				if !ok {
					if ev.Type == watch.Error {
						rv = ""
					}
					continue
				}
				rv = c.ResourceVersion
				if c.Status.MachineName == "" {
					continue
				}
				h.mu.Lock()
				if h.byClaim[c.Name] == nil {
					h.byClaim[c.Name] = map[string]bool{}
				}
				if h.byMachine[c.Status.MachineName] == nil {
					h.byMachine[c.Status.MachineName] = map[string]bool{}
				}
				h.byClaim[c.Name][c.Status.MachineName] = true
				h.byMachine[c.Status.MachineName][c.Name] = true
				h.mu.Unlock()
			}
			w.Stop()
		}
	}()
	return h
}

func (h *scaleBinds) boundCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.byClaim)
}

// check fails the test for a claim that named two Machines or a Machine
// named by two claims, over the whole watch.
func (h *scaleBinds) check(t *testing.T, claims int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.byClaim) != claims {
		t.Errorf("%d claims seen bound, want %d", len(h.byClaim), claims)
	}
	for c, ms := range h.byClaim {
		if len(ms) > 1 {
			t.Errorf("claim %s named several Machines: %v", c, ms)
		}
	}
	for m, cs := range h.byMachine {
		if len(cs) > 1 {
			t.Errorf("Machine %s named by several claims: %v", m, cs)
		}
	}
}
