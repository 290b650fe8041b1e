package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

// claimBenchEnv turns on TestClaimBench (make bench-claim). It is a
// measurement, not a test: it asserts no timing, only that every claim
// binds.
const claimBenchEnv = "KAIRON_CLAIM_BENCH"

// claimBenchQEMUEnv, when 0, leaves out the QEMU half.
const claimBenchQEMUEnv = "KAIRON_CLAIM_BENCH_QEMU"

// claimBenchSimEnv, when 0, leaves out the sim half.
const claimBenchSimEnv = "KAIRON_CLAIM_BENCH_SIM"

// claimBenchSizesEnv overrides the burst sizes of the sim half, e.g. "1,100".
const claimBenchSizesEnv = "KAIRON_CLAIM_BENCH_SIZES"

// TestClaimBench measures warm claims on kairon-local: `kairon-local up
// --nodes 0` (etcd, kube-apiserver, kube-controller-manager, Kairon's CRDs),
// bin/kairon-controller, and bin/kairon-node agents started by the test.
//
// Sim half (one agent, --backend sim, 2 s simulated boot): the API
// server's write rate first (ConfigMap creates and patches from 16 clients,
// and one client's sequential latency), then for C = 1, 100 and 1,000 a
// pool of W = C warm members and a burst of C claims. Per burst: claim
// create → Bound as a watching client sees it, status.bindMillis,
// `kaironctl claim` wall time (the real binary: every claim for C = 1, a
// sample started with the burst for larger C), throughput, and the API
// server's write requests (apiserver_request_total from its /metrics) per
// bind, counted until the last claim is Bound and until the pool is warm
// again. Then the cold path: a claim against a pool that has no member yet,
// and a plain Machine created → Running.
//
// QEMU half (one agent with the real backend, TCG on this machine): C = 1
// warm claims against cold claims and cold Machines.
//
// In the sim half the test also reads kairon-controller's CPU time
// (process_cpu_seconds_total) around each burst and prints it per bind;
// with KAIRON_CLAIM_BENCH_PROFILE=DIR it saves a CPU profile of the
// controller during each burst of more than one claim into DIR.
//
//	KAIRON_CLAIM_BENCH=1 KAIRON_BIN_DIR=$PWD/bin go test -count=1 -timeout 120m -run TestClaimBench -v ./test/e2e/
func TestClaimBench(t *testing.T) {
	if os.Getenv(claimBenchEnv) == "" {
		t.Skipf("a measurement; set %s=1 (make bench-claim)", claimBenchEnv)
	}
	t.Logf("load average before: %s", loadAvg())
	t.Cleanup(func() { t.Logf("load average after: %s", loadAvg()) })
	t.Run("sim", func(t *testing.T) {
		if os.Getenv(claimBenchSimEnv) == "0" {
			t.Skipf("%s=0", claimBenchSimEnv)
		}
		cb := newClaimBench(t)
		cb.writeRate()
		cb.bindFloor = cb.bindWriteFloor()
		agentEnv := cb.env()
		startSimAgent(t, agentEnv, "bench-sim", "10.80.0.0/16", 2400, "640Gi", "--sim-boot-delay", "2s")
		waitNodeReady(t, agentEnv, "bench-sim")
		cb.controller = startBenchController(t, agentEnv)
		if os.Getenv(claimBenchProfileEnv) != "" {
			cb.controller.apiServer = cb.cs.Discovery().RESTClient()
		}
		cb.warmUp()
		sizes := []int{1, 100, 1000}
		if s := os.Getenv(claimBenchSizesEnv); s != "" {
			sizes = nil
			for _, f := range strings.Split(s, ",") {
				n, err := strconv.Atoi(f)
				if err != nil || n < 1 || n > 1000 {
					t.Fatalf("%s=%q: want sizes from 1 to 1000, comma separated", claimBenchSizesEnv, s)
				}
				sizes = append(sizes, n)
			}
		}
		for _, c := range sizes {
			cb.burst(c)
		}
		cb.coldClaims(5)
		cb.coldMachines(5)
	})
	if os.Getenv(claimBenchQEMUEnv) == "0" {
		return
	}
	t.Run("qemu", func(t *testing.T) {
		cb := newClaimBench(t)
		agentEnv := cb.env()
		state, err := os.MkdirTemp("", "kairon-cb-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(state) })
		t.Cleanup(func() { killVMs(t, state) })
		// Room for the warm member, the claimed one and its replacement.
		startAgentWithCapacity(t, agentEnv, "bench-qemu", state, cb.local.netNS, 4, "2Gi")
		waitNodeReady(t, agentEnv, "bench-qemu")
		startController(t, agentEnv)
		cb.sequentialWarm(5)
		cb.coldClaims(3)
		cb.coldMachines(3)
	})
}

type claimBench struct {
	t     *testing.T
	local *localCluster
	c     client.WithWatch
	cs    *kubernetes.Clientset
	ns    string
	scm   *runtime.Scheme
	// writesPerSec and writeLatency: the API server's measured write rate
	// from 16 clients and one client's time per write.
	writesPerSec float64
	writeLatency time.Duration
	// bindFloor: the same, measured on the bind's own kinds of write.
	bindFloor bindWriteFloor
	// controller, in the sim half: the controller's CPU time per bind.
	controller *benchController
}

func newClaimBench(t *testing.T) *claimBench {
	var local *localCluster
	if os.Getenv(claimBenchProfileEnv) != "" {
		local = startKaironLocalWith(t, 0, "--apiserver-profiling")
	} else {
		local = startKaironLocal(t, 0)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", local.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	// The client must not be what a burst waits on.
	cfg.QPS, cfg.Burst = 5000, 10000
	scm := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, kaironv1.AddToScheme} {
		if err := add(scm); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scm})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return &claimBench{t: t, local: local, c: c, cs: cs, ns: ns.Name, scm: scm}
}

// controllerCPU is the controller's CPU seconds so far; 0 where the
// benchmark does not watch it.
func (cb *claimBench) controllerCPU() float64 {
	if cb.controller == nil {
		return 0
	}
	return cb.controller.cpuSeconds()
}

// env is the kairon-local cluster in the shape the harness's helpers take.
func (cb *claimBench) env() *testenv.Env {
	return &testenv.Env{Client: cb.c, Scheme: cb.scm, Kubeconfig: cb.local.kubeconfig,
		BinDir: cb.local.binDir, DataDir: cb.local.dataDir}
}

// writeRate measures the API server alone, writeRateRounds times: 400
// ConfigMap writes (200 creates, 200 patches) from 16 clients, then 100
// from one client in turn. It keeps the fastest of each.
func (cb *claimBench) writeRate() {
	t := cb.t
	ctx := context.Background()
	const n, clients = 200, 16
	unit := func(prefix string, i int) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: cb.ns, Name: fmt.Sprintf("%s-%d", prefix, i),
			Labels: map[string]string{"kairon-bench": "write-rate"}}, Data: map[string]string{"k": "v"}}
		if err := cb.c.Create(ctx, cm); err != nil {
			t.Error(err)
			return
		}
		p := []byte(`{"data":{"k":"w"}}`)
		if err := cb.c.Patch(ctx, cm, client.RawPatch(types.MergePatchType, p)); err != nil {
			t.Error(err)
		}
	}
	// A round lasts well under a second, so one garbage collection or
	// one busy moment of the machine can halve it. The fastest of three
	// rounds is the nearest to what the API server can do: the lowest
	// floor, which makes the ratio against it the strictest.
	m := measureWrites("rate", 2, n, 50, clients, unit, func() {
		if err := cb.c.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace(cb.ns), client.MatchingLabels{"kairon-bench": "write-rate"}); err != nil {
			t.Logf("deleting the ConfigMaps: %v", err)
		}
	})
	cb.writesPerSec, cb.writeLatency = m.rate, m.latency
	rounds, singles := m.rates, m.latencies
	t.Logf("API server writes (ConfigMap create+patch): %.0f writes/s from %d clients, the fastest of %d rounds of %d writes (%s/s); one client: %.2f ms per write, the fastest of %s ms",
		cb.writesPerSec, clients, writeRateRounds, 2*n, strings.Join(rounds, ", "), ms(cb.writeLatency), strings.Join(singles, ", "))
}

// writeRounds is what measureWrites found: the fastest rate and time per
// write, and each round's, formatted.
type writeRounds struct {
	rate             float64
	latency          time.Duration
	rates, latencies []string
}

// measureWrites runs writeRateRounds rounds of units calls of unit (each
// making writesPerUnit writes) from clients goroutines, and of seqUnits
// calls from one, calling after after each round.
func measureWrites(prefix string, writesPerUnit, units, seqUnits, clients int, unit func(prefix string, i int), after func()) writeRounds {
	var m writeRounds
	for round := range writeRateRounds {
		took := inWorkers(units, clients, func(i int) { unit(fmt.Sprintf("%s%d", prefix, round), i) })
		rate := float64(writesPerUnit*units) / took.Seconds()
		m.rate = max(m.rate, rate)
		m.rates = append(m.rates, fmt.Sprintf("%.0f", rate))
		one := inWorkers(seqUnits, 1, func(i int) { unit(fmt.Sprintf("%sseq%d", prefix, round), i) }) / time.Duration(writesPerUnit*seqUnits)
		if m.latency == 0 || one < m.latency {
			m.latency = one
		}
		m.latencies = append(m.latencies, fmt.Sprintf("%.2f", ms(one)))
		after()
	}
	return m
}

// inWorkers calls do(0), …, do(count-1) from workers goroutines and
// returns how long they all took.
func inWorkers(count, workers int, do func(i int)) time.Duration {
	start := time.Now()
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				do(i)
			}
		})
	}
	for i := range count {
		next <- i
	}
	close(next)
	wg.Wait()
	return time.Since(start)
}

// writeRateRounds is how many times writeRate measures.
const writeRateRounds = 3

// pool creates pool name with replicas warm members and waits until they
// are all Running.
func (cb *claimBench) pool(name string, replicas int, wait bool) {
	t := cb.t
	p := &kaironv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: cb.ns, Name: name},
		Spec: kaironv1.MachinePoolSpec{Replicas: ptr.To(int32(replicas))}}
	if err := cb.c.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if wait {
		// A sim node brings about one member a second to Running on this
		// machine: 1,000 take a quarter of an hour.
		cb.waitWarm(name, replicas, 40*time.Minute)
	}
}

func (cb *claimBench) waitWarm(name string, replicas int, limit time.Duration) {
	cb.t.Helper()
	ctx := context.Background()
	p := &kaironv1.MachinePool{}
	testenv.Eventually(cb.t, limit, fmt.Sprintf("pool %s: %d Running warm members", name, replicas), func() (bool, string) {
		if err := cb.c.Get(ctx, client.ObjectKey{Namespace: cb.ns, Name: name}, p); err != nil {
			return false, err.Error()
		}
		status := fmt.Sprintf("status: warm %d, readyWarm %d, claimed %d", p.Status.Warm, p.Status.ReadyWarm, p.Status.Claimed)
		if p.Status.ReadyWarm != int32(replicas) || p.Status.Warm != int32(replicas) {
			return false, status
		}
		// The pool's status alone is not enough: it is written a quarter
		// second after a change (pool_status_pacing.go), so right after a
		// bind it still shows the member just taken as warm and ready, and
		// a claim made then would wait for the replacement's boot. The
		// members themselves say when the pool is warm again; they are
		// listed only once the status says so, as a list of a thousand
		// Machines every poll would load the API server being measured.
		ready, warming, err := cb.warmMembers(ctx, p)
		if err != nil {
			return false, err.Error()
		}
		return ready == replicas && warming == 0, fmt.Sprintf("members: %d ready, %d warming; %s", ready, warming, status)
	})
}

// warmMembers counts pool's warm members as the API server has them: those
// a claim can be bound to now, and those still on their way.
func (cb *claimBench) warmMembers(ctx context.Context, pool *kaironv1.MachinePool) (ready, warming int, err error) {
	var ms kaironv1.MachineList
	if err := cb.c.List(ctx, &ms, client.InNamespace(cb.ns), client.MatchingLabels{
		kaironv1.LabelMachinePool: pool.Name, kaironv1.LabelPoolState: kaironv1.PoolStateWarm,
	}); err != nil {
		return 0, 0, err
	}
	for i := range ms.Items {
		switch m := &ms.Items[i]; {
		case m.DeletionTimestamp != nil:
		case rules.WarmMemberReady(pool, m):
			ready++
		default:
			warming++
		}
	}
	return ready, warming, nil
}

// clearOut deletes every claim (their Machines go with them) and pool and
// waits until no Machine is left.
func (cb *claimBench) clearOut() {
	t := cb.t
	ctx := context.Background()
	if err := cb.c.DeleteAllOf(ctx, &kaironv1.MachineClaim{}, client.InNamespace(cb.ns)); err != nil {
		t.Fatal(err)
	}
	if err := cb.c.DeleteAllOf(ctx, &kaironv1.MachinePool{}, client.InNamespace(cb.ns)); err != nil {
		t.Fatal(err)
	}
	if err := cb.c.DeleteAllOf(ctx, &kaironv1.Machine{}, client.InNamespace(cb.ns)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Minute, "every Machine and claim gone", func() (bool, string) {
		var ms kaironv1.MachineList
		var cs kaironv1.MachineClaimList
		if err := cb.c.List(ctx, &ms, client.InNamespace(cb.ns)); err != nil {
			return false, err.Error()
		}
		if err := cb.c.List(ctx, &cs, client.InNamespace(cb.ns)); err != nil {
			return false, err.Error()
		}
		return len(ms.Items) == 0 && len(cs.Items) == 0, fmt.Sprintf("%d Machines, %d claims", len(ms.Items), len(cs.Items))
	})
}

// claimWatch records when a watching client first sees each claim Bound.
type claimWatch struct {
	mu     sync.Mutex
	bound  map[string]time.Time
	millis map[string]int64
	// restarts: the watch ended and was opened again.
	restarts int
	stop     func()
}

// watchClaims records the claims whose names start with prefix. A watch
// from no resourceVersion begins with every claim that exists, already
// Bound ones included, so the others are left out.
func (cb *claimBench) watchClaims(prefix string) *claimWatch {
	t := cb.t
	ctx, cancel := context.WithCancel(context.Background())
	cw := &claimWatch{bound: map[string]time.Time{}, millis: map[string]int64{}}
	var mu sync.Mutex
	var current watch.Interface
	open := func(rv string) (watch.Interface, error) {
		w, err := cb.c.Watch(ctx, &kaironv1.MachineClaimList{}, client.InNamespace(cb.ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err == nil {
			mu.Lock()
			current = w
			mu.Unlock()
		}
		return w, err
	}
	w, err := open("")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		rv := ""
		for {
			for ev := range w.ResultChan() {
				at := time.Now()
				c, ok := ev.Object.(*kaironv1.MachineClaim)
				if !ok {
					if ev.Type == watch.Error {
						// Most likely 410 Gone: start again from now.
						rv = ""
					}
					continue
				}
				rv = c.ResourceVersion
				if ev.Type == watch.Deleted || c.Status.Phase != kaironv1.ClaimBound || !strings.HasPrefix(c.Name, prefix) {
					continue
				}
				cw.mu.Lock()
				if _, seen := cw.bound[c.Name]; !seen {
					cw.bound[c.Name] = at
					cw.millis[c.Name] = c.Status.BindMillis
				}
				cw.mu.Unlock()
			}
			if ctx.Err() != nil {
				return
			}
			// The API server ends a watch whose client falls behind (a
			// loaded machine); carry on from the last event seen.
			cw.mu.Lock()
			cw.restarts++
			cw.mu.Unlock()
			for {
				if w, err = open(rv); err == nil {
					break
				}
				if ctx.Err() != nil {
					return
				}
				// A pause between attempts to reopen, so that a
				// struggling API server is not asked in a tight loop.
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	cw.stop = func() {
		cancel()
		mu.Lock()
		current.Stop()
		mu.Unlock()
		<-done
		if cw.restarts > 0 {
			t.Logf("the claim watch was ended by the API server and reopened %d time(s)", cw.restarts)
		}
	}
	return cw
}

func (cw *claimWatch) count() int {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return len(cw.bound)
}

func (cw *claimWatch) boundAt(name string) (time.Time, int64, bool) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	at, ok := cw.bound[name]
	return at, cw.millis[name], ok
}

// describeClaims says how the claims of names that cw has not seen Bound
// stand: phase, machine, finalizers, deletion, conditions.
func (cb *claimBench) describeClaims(names []string, cw *claimWatch) string {
	var out []string
	for _, name := range names {
		if _, _, ok := cw.boundAt(name); ok {
			continue
		}
		var c kaironv1.MachineClaim
		if err := cb.c.Get(context.Background(), types.NamespacedName{Namespace: cb.ns, Name: name}, &c); err != nil {
			out = append(out, fmt.Sprintf("%s (%v)", name, err))
			continue
		}
		var conds []string
		for _, cond := range c.Status.Conditions {
			conds = append(conds, fmt.Sprintf("%s=%s/%s: %s", cond.Type, cond.Status, cond.Reason, cond.Message))
		}
		out = append(out, fmt.Sprintf("%s (rv %s, phase %q, machine %q, finalizers %q, deleting %v, message %q, conditions %q)",
			name, c.ResourceVersion, c.Status.Phase, c.Status.MachineName, c.Finalizers, c.DeletionTimestamp != nil, c.Status.Message, conds))
	}
	return strings.Join(out, "; ")
}

// warmUp binds one claim, unmeasured, before the bursts. The API server
// fills some caches on the first request of a kind, not before: the first
// MachineClaim it creates has it read and parse the group's whole OpenAPI
// schema for the claim-finalizer admission policy, tens of milliseconds of
// CPU, once per API server process (and as many times at once as creates
// arrive together before the first is done). A cluster that has served
// one claim has paid that already; the bursts measure what every claim
// after it costs.
func (cb *claimBench) warmUp() {
	t := cb.t
	ctx := context.Background()
	const pool = "warm-up"
	cb.pool(pool, 1, true)
	claim := cb.newClaim(pool, "warm-up")
	var unstamped atomic.Int32
	if err := cb.createClaim(ctx, claim, &unstamped); err != nil {
		t.Fatalf("creating the warm-up claim: %v", err)
	}
	testenv.Eventually(t, 5*time.Minute, "the warm-up claim Bound", func() (bool, string) {
		var c kaironv1.MachineClaim
		if err := cb.c.Get(ctx, client.ObjectKeyFromObject(claim), &c); err != nil {
			return false, err.Error()
		}
		return c.Status.Phase == kaironv1.ClaimBound, string(c.Status.Phase)
	})
	if err := cb.c.Delete(ctx, &kaironv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: cb.ns, Name: pool}}); err != nil {
		t.Fatalf("deleting the warm-up pool: %v", err)
	}
	if err := cb.c.Delete(ctx, claim); err != nil {
		t.Fatalf("deleting the warm-up claim: %v", err)
	}
	testenv.Eventually(t, 5*time.Minute, "the warm-up claim and pool gone", func() (bool, string) {
		var machines kaironv1.MachineList
		if err := cb.c.List(ctx, &machines, client.InNamespace(cb.ns)); err != nil {
			return false, err.Error()
		}
		err := cb.c.Get(ctx, client.ObjectKeyFromObject(claim), &kaironv1.MachineClaim{})
		return apierrors.IsNotFound(err) && len(machines.Items) == 0, fmt.Sprintf("claim: %v; %d Machines", err, len(machines.Items))
	})
}

// newClaim is a claim on pool, stamped with its creation time to the
// millisecond as kaironctl stamps it.
func (cb *claimBench) newClaim(pool, name string) *kaironv1.MachineClaim {
	return &kaironv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: cb.ns, Name: name,
			Annotations: map[string]string{kaironv1.AnnotationClaimCreatedAt: time.Now().UTC().Format(rules.ClaimStampFormat)}},
		Spec: kaironv1.MachineClaimSpec{PoolName: pool},
	}
}

// createClaim creates claim as kaironctl does: a creation stamp the API
// server refuses (the create waited in it for more than a second, which
// happens on a loaded machine) is left out and the claim created again,
// counted in unstamped.
func (cb *claimBench) createClaim(ctx context.Context, claim *kaironv1.MachineClaim, unstamped *atomic.Int32) error {
	err := cb.c.Create(ctx, claim)
	if apierrors.IsInvalid(err) && strings.Contains(err.Error(), kaironv1.AnnotationClaimCreatedAt) {
		unstamped.Add(1)
		claim.Annotations = nil
		claim.ResourceVersion = ""
		err = cb.c.Create(ctx, claim)
	}
	return err
}

var claimBoundLine = regexp.MustCompile(`^machineclaim/(\S+) bound to machine/(\S+) in ([0-9]+)ms\n$`)

// kaironctlClaim runs `kaironctl claim POOL --name NAME` and returns its
// wall time and the bindMillis it printed.
func (cb *claimBench) kaironctlClaim(pool, name string) (time.Duration, int64) {
	run := runKaironctl(cb.t, &testenv.Env{Kubeconfig: cb.local.kubeconfig, BinDir: cb.local.binDir}, 5*time.Minute,
		"-n", cb.ns, "claim", pool, "--name", name, "--wait", "4m")
	m := claimBoundLine.FindStringSubmatch(run.stdout)
	if run.code != 0 || m == nil {
		cb.t.Logf("kaironctl claim %s exited %d:\n%s%s", pool, run.code, run.stdout, run.stderr)
		cb.t.Errorf("kaironctl claim %s exited %d:\n%s%s", pool, run.code, run.stdout, run.stderr)
		return run.took, 0
	}
	bm, _ := strconv.ParseInt(m[3], 10, 64)
	return run.took, bm
}

// burst: a pool of c warm members, then c claims at once: c-k from 16
// client goroutines, k from as many kaironctl processes started with them.
func (cb *claimBench) burst(c int) {
	t := cb.t
	ctx := context.Background()
	pool := fmt.Sprintf("p%d", c)
	k := 0
	switch {
	case c >= 1000:
		k = 10
	case c >= 100:
		k = 5
	}
	reps := 1
	if c == 1 {
		// One claim at a time, each against a full pool of one.
		reps = 20
	}
	cb.pool(pool, c, true)

	var watched, bindMs, ctlWall, ctlBindMs, createCalls []time.Duration
	var span time.Duration
	var atBound, atSettled map[writeKey]float64
	var cpuBound, cpuSettled float64
	for rep := range reps {
		settle := 2 * time.Second // the new pool's own writes
		if rep > 0 {
			cb.waitWarm(pool, c, 5*time.Minute)
			settle = 500 * time.Millisecond // the refill's last writes
		}
		t.Logf("C=%d: burst %d of %d", c, rep+1, reps)
		before := cb.apiWrites()
		cpuBefore := cb.controllerCPU()
		cw := cb.watchClaims(fmt.Sprintf("%s-r%d-", pool, rep))
		// The pause comes after reading the API server's /metrics, not
		// before: rendering them is a large allocation, and the garbage
		// collection it sets off in the API server would otherwise fall
		// on the burst's first writes. A pause, not a wait: no object
		// says the last of those writes has landed.
		time.Sleep(settle)
		profiled := func() {}
		if cb.controller != nil && rep == 0 {
			profiled = cb.controller.profileBurst(c)
		}
		created := make([]time.Time, c)
		names := make([]string, c)
		for i := range c {
			names[i] = fmt.Sprintf("%s-r%d-%04d", pool, rep, i)
		}
		var wg sync.WaitGroup
		next := make(chan int)
		start := time.Now()
		var ctlMu sync.Mutex
		var unstamped atomic.Int32
		// c == 1 alternates: even reps a client create, odd reps kaironctl.
		viaCtl := func(i int) bool { return (c == 1 && rep%2 == 1) || (c > 1 && i >= c-k) }
		for i := range c {
			if !viaCtl(i) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				created[i] = time.Now()
				took, bm := cb.kaironctlClaim(pool, names[i])
				t.Logf("kaironctl claim %s: %s, bindMillis %d", names[i], took.Round(time.Millisecond), bm)
				ctlMu.Lock()
				ctlWall = append(ctlWall, took)
				ctlBindMs = append(ctlBindMs, time.Duration(bm)*time.Millisecond)
				ctlMu.Unlock()
			}()
		}
		for range min(16, c) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					created[i] = time.Now()
					if err := cb.createClaim(ctx, cb.newClaim(pool, names[i]), &unstamped); err != nil {
						t.Errorf("creating claim %s: %v", names[i], err)
					}
					took := time.Since(created[i])
					ctlMu.Lock()
					createCalls = append(createCalls, took)
					ctlMu.Unlock()
				}
			}()
		}
		for i := range c {
			if !viaCtl(i) {
				next <- i
			}
		}
		close(next)
		wg.Wait()
		if n := unstamped.Load(); n > 0 {
			t.Logf("  %d of the client's claims were refused their creation stamp (created more than a second after it) and created without one, as kaironctl does; their bindMillis starts at the controller's first sight", n)
		}
		testenv.Eventually(t, 5*time.Minute, fmt.Sprintf("%d claims Bound", c), func() (bool, string) {
			n := cw.count()
			if n == c || n < c-3 {
				return n == c, fmt.Sprintf("%d Bound", n)
			}
			// The last few: say which, and how they stand, should
			// they never bind.
			return false, fmt.Sprintf("%d Bound; not yet: %s", n, cb.describeClaims(names, cw))
		})
		atBound = addWrites(atBound, diffWrites(before, cb.apiWrites()))
		cpuBound += cb.controllerCPU() - cpuBefore
		var last time.Time
		for i, name := range names {
			at, bm, _ := cw.boundAt(name)
			if at.After(last) {
				last = at
			}
			bindMs = append(bindMs, time.Duration(bm)*time.Millisecond)
			if !viaCtl(i) {
				watched = append(watched, at.Sub(created[i]))
			}
		}
		cw.stop()
		span += last.Sub(start)
		if reps == 1 {
			t.Logf("C=%d: all Bound %s after the first create; waiting for the pool's %d replacements", c, last.Sub(start).Round(time.Millisecond), c)
		}
		cb.waitWarm(pool, c, 40*time.Minute)
		atSettled = addWrites(atSettled, diffWrites(before, cb.apiWrites()))
		cpuSettled += cb.controllerCPU() - cpuBefore
		profiled()
	}
	binds := float64(c * reps)
	t.Logf("C=%d W=%d (%d burst(s)); claims via kaironctl: %d", c, c, reps, len(ctlWall))
	t.Logf("  create -> Bound (watch, client-created claims): %s", summary(watched))
	t.Logf("  status.bindMillis (all claims): %s", summary(bindMs))
	t.Logf("  the client's create calls: %s", summary(createCalls))
	if len(ctlWall) > 0 {
		t.Logf("  kaironctl claim wall time: %s", summary(ctlWall))
		t.Logf("  kaironctl claims' bindMillis: %s", summary(ctlBindMs))
	}
	t.Logf("  throughput: %.1f claims bound/s (%d claims, first create to last Bound %s per burst)",
		binds/span.Seconds(), c, (span / time.Duration(reps)).Round(time.Millisecond))
	t.Logf("  API writes per bind until the last Bound: %s", formatWrites(atBound, binds))
	t.Logf("  API writes per bind until the pool is warm again: %s", formatWrites(atSettled, binds))
	if cb.controller != nil {
		t.Logf("  kairon-controller CPU per bind: %.2f ms until the last Bound, %.2f ms until the pool is warm again",
			1000*cpuBound/binds, 1000*cpuSettled/binds)
	}
	if cb.writesPerSec > 0 {
		// 2: the fewest the design needs, the Machine's take and the
		// claim's status (the API server adds the claim finalizer at
		// creation); then what this burst measured.
		for _, wpb := range []float64{2, controllerWritesPerBind(atBound, binds)} {
			floor := time.Duration(float64(c) * (1 + wpb) / cb.writesPerSec * float64(time.Second))
			t.Logf("  floor at %.2f writes per bind + the create, %.0f writes/s: %s for the burst (one claim alone: %s)",
				wpb, cb.writesPerSec, floor.Round(time.Millisecond), time.Duration((1+wpb)*float64(cb.writeLatency)).Round(100*time.Microsecond))
		}
	}
	if bf := cb.bindFloor; bf.writesPerSec > 0 {
		floor := time.Duration(float64(c) * 3 / bf.writesPerSec * float64(time.Second))
		t.Logf("  floor at the bind's own 3 writes (claim create, take, status), %.0f writes/s: %s for the burst (one claim alone: %s)",
			bf.writesPerSec, floor.Round(time.Millisecond), (3 * bf.writeLatency).Round(100*time.Microsecond))
	}
	cb.clearOut()
}

// sequentialWarm: n claims one at a time against a pool of one warm
// member, alternately from the client and from kaironctl.
func (cb *claimBench) sequentialWarm(n int) {
	t := cb.t
	ctx := context.Background()
	pool := "warm"
	cb.pool(pool, 1, true)
	var watched, bindMs, ctlWall, ctlBindMs []time.Duration
	for i := range n {
		cb.waitWarm(pool, 1, 5*time.Minute)
		// The refill's last writes (the pool's status, events) land after
		// the pool reads warm, and no object says when they have: a pause,
		// so that they do not fall inside the measured bind.
		time.Sleep(time.Second)
		name := fmt.Sprintf("warm-%d", i)
		cw := cb.watchClaims(name)
		if i%2 == 1 {
			took, bm := cb.kaironctlClaim(pool, name)
			ctlWall = append(ctlWall, took)
			ctlBindMs = append(ctlBindMs, time.Duration(bm)*time.Millisecond)
		} else {
			start := time.Now()
			if err := cb.c.Create(ctx, cb.newClaim(pool, name)); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 5*time.Minute, name+" Bound", func() (bool, string) { return cw.count() == 1, "" })
			at, bm, _ := cw.boundAt(name)
			watched = append(watched, at.Sub(start))
			bindMs = append(bindMs, time.Duration(bm)*time.Millisecond)
		}
		cw.stop()
		// The claimed Machine goes, so the node has room for the next.
		if err := cb.c.Delete(ctx, &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: cb.ns, Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("warm C=1 W=1, %d claims one at a time", n)
	t.Logf("  create -> Bound (watch, client): %s", summary(watched))
	t.Logf("  status.bindMillis (client): %s", summary(bindMs))
	t.Logf("  kaironctl claim wall time: %s", summary(ctlWall))
	t.Logf("  kaironctl claims' bindMillis: %s", summary(ctlBindMs))
	cb.clearOut()
}

// coldClaims: n times, a pool of one member and a claim created together,
// so the claim waits for the member's boot.
func (cb *claimBench) coldClaims(n int) {
	t := cb.t
	ctx := context.Background()
	var watched, bindMs []time.Duration
	for i := range n {
		pool := fmt.Sprintf("cold%d", i)
		cw := cb.watchClaims(pool + "-claim")
		start := time.Now()
		cb.pool(pool, 1, false)
		if err := cb.c.Create(ctx, cb.newClaim(pool, pool+"-claim")); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 5*time.Minute, pool+"-claim Bound", func() (bool, string) { return cw.count() == 1, "" })
		at, bm, _ := cw.boundAt(pool + "-claim")
		watched = append(watched, at.Sub(start))
		bindMs = append(bindMs, time.Duration(bm)*time.Millisecond)
		cw.stop()
		cb.clearOut()
	}
	t.Logf("cold claim (pool and claim created together, the member boots), %d:", n)
	t.Logf("  pool create -> claim Bound (watch): %s", summary(watched))
	t.Logf("  status.bindMillis: %s", summary(bindMs))
}

// coldMachines: n Machines, one at a time, created -> Running as a watch
// sees it.
func (cb *claimBench) coldMachines(n int) {
	t := cb.t
	ctx := context.Background()
	var boots []time.Duration
	for i := range n {
		name := fmt.Sprintf("cold-m%d", i)
		w, err := cb.c.Watch(ctx, &kaironv1.MachineList{}, client.InNamespace(cb.ns))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := cb.c.Create(ctx, &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: cb.ns, Name: name}}); err != nil {
			t.Fatal(err)
		}
		deadline := time.After(5 * time.Minute)
	wait:
		for {
			select {
			case ev, open := <-w.ResultChan():
				if !open {
					t.Fatalf("the watch on Machines ended before %s was Running", name)
				}
				if m, ok := ev.Object.(*kaironv1.Machine); ok && m.Name == name && m.Status.Phase == kaironv1.MachineRunning {
					boots = append(boots, time.Since(start))
					break wait
				}
			case <-deadline:
				t.Fatalf("%s not Running after 5m", name)
			}
		}
		w.Stop()
		cb.clearOut()
	}
	t.Logf("cold Machine created -> Running (watch), %d: %s", n, summary(boots))
}

// writeKey is one row of apiserver_request_total: a write verb on a
// resource.
// code is the response's code when it is not 2xx (a 409 is a write
// refused by an optimistic lock: it costs the API server a request too).
type writeKey struct{ verb, resource, subresource, code string }

// apiWrites reads the API server's write requests so far from /metrics.
func (cb *claimBench) apiWrites() map[writeKey]float64 {
	out := map[writeKey]float64{}
	cb.eachRequestCounter(func(labels map[string]string, v float64) {
		if !testenv.IsWrite(labels["verb"]) {
			return
		}
		code := labels["code"]
		if strings.HasPrefix(code, "2") {
			code = ""
		}
		out[writeKey{labels["verb"], labels["resource"], labels["subresource"], code}] += v
	})
	return out
}

// eachRequestCounter calls fn with the labels and value of every
// apiserver_request_total series.
func (cb *claimBench) eachRequestCounter(fn func(labels map[string]string, v float64)) {
	if err := testenv.EachAPIRequestCounter(context.Background(), cb.cs.Discovery().RESTClient(), fn); err != nil {
		cb.t.Fatal(err)
	}
}

func diffWrites(before, after map[writeKey]float64) map[writeKey]float64 {
	out := map[writeKey]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func addWrites(a, b map[writeKey]float64) map[writeKey]float64 {
	if a == nil {
		a = map[writeKey]float64{}
	}
	for k, v := range b {
		a[k] += v
	}
	return a
}

// controllerWritesPerBind: the writes of the bind itself, per bind — the
// claim's patches other than its create, its status, and the Machine's
// metadata patches (the bind; the scheduler's spec.nodeName of refills is
// counted too, when it falls in the window).
func controllerWritesPerBind(w map[writeKey]float64, binds float64) float64 {
	var n float64
	for k, v := range w {
		switch {
		case k.code != "":
		case k.resource == "machineclaims" && k.verb != "CREATE" && k.verb != "POST":
			n += v
		case k.resource == "machines" && k.subresource == "" && (k.verb == "PATCH" || k.verb == "UPDATE" || k.verb == "APPLY"):
			n += v
		}
	}
	return n / binds
}

func formatWrites(w map[writeKey]float64, binds float64) string {
	var keys []writeKey
	var total float64
	for k, v := range w {
		keys = append(keys, k)
		total += v
	}
	sort.Slice(keys, func(i, j int) bool { return w[keys[i]] > w[keys[j]] })
	var parts []string
	for _, k := range keys {
		r := k.resource
		if k.subresource != "" {
			r += "/" + k.subresource
		}
		if k.code != "" {
			r += " (" + k.code + ")"
		}
		parts = append(parts, fmt.Sprintf("%s %s %.2f", k.verb, r, w[k]/binds))
	}
	return fmt.Sprintf("%.2f in all [%s]", total/binds, strings.Join(parts, ", "))
}

func summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return fmt.Sprintf("n=%d p50 %.1f ms, p95 %.1f ms, p99 %.1f ms, max %.1f ms",
		len(s), ms(percentile(s, 50)), ms(percentile(s, 95)), ms(percentile(s, 99)), ms(s[len(s)-1]))
}

func loadAvg() string {
	raw, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(raw))
}
