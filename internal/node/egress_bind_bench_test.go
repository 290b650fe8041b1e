package node_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/controller"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// TestEgressBindLatency measures, in one run, the bind latency of claims
// with and without spec.egress on a warm MachinePool: a links-mode agent
// (sim backend for the VMs, real bridge, taps and nftables in a network
// namespace, so enforcement is real) and every Kairon controller in this
// process. The claims are made one at a time, alternating with and without
// egress, each once the one before is Bound. For each kind it logs
// p50/p99/max of status.bindMillis and of create→Bound as a watching
// client sees it. A measurement, not a check: run with
// KAIRON_EGRESS_BENCH=1 (KAIRON_EGRESS_BENCH_CLAIMS of each kind,
// default 30). Back to back by default, so each claim shares the API
// server with the refill of the one before; KAIRON_EGRESS_BENCH_IDLE=1
// makes each claim wait until the pool is warm again and quiet, to
// measure a claim on an idle pool. KAIRON_EGRESS_BENCH_SAMPLES=<file>
// appends the run's claims to file and logs the figures of every run
// there pooled (egress_bench_samples_test.go).
func TestEgressBindLatency(t *testing.T) {
	if os.Getenv("KAIRON_EGRESS_BENCH") != "1" {
		t.Skip("a measurement: KAIRON_EGRESS_BENCH=1 runs it")
	}
	host.SkipIfShort(t, "root and the control plane")
	perKind := 30
	if v, err := strconv.Atoi(os.Getenv("KAIRON_EGRESS_BENCH_CLAIMS")); err == nil && v > 0 {
		perKind = v
	}
	idle := os.Getenv("KAIRON_EGRESS_BENCH_IDLE") == "1"
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	netns := "kairon-bind-bench-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", netns).Run() })

	// Warm members for every claim, and as many again for the pool to keep
	// warm while claims take them: no claim waits for a boot.
	warm := int32(2*perKind + 4)
	state := t.TempDir()
	nodeName := ns + "-node"
	vms, err := sim.New(sim.Options{StateDir: filepath.Join(state, "instances"), BootDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := node.New(env.Config, node.Options{
		NodeName: nodeName, Register: true, Backend: vms, StateDir: state,
		CPU: int64(4*warm + 16), Memory: resource.MustParse("256Gi"),
		Network:  &node.NetworkOptions{CIDR: netip.MustParsePrefix("10.88.16.0/22"), Bridge: "kbr0", NetNS: netns},
		Interval: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so that they run once the agent and the
	// controllers stopped.
	t.Cleanup(func() { _ = env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}) })
	t.Cleanup(func() { env.StripFinalizers(ns) })
	testenv.RunInBackground(t, "agent", agent.Run)

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: env.Scheme,
		// Conflicts and the like, routine for controllers, would drown
		// the figures.
		Logger:                 zap.New(zap.WriteTo(io.Discard)),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := controller.SetupWithManager(mgr, controller.Options{Interval: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	testenv.RunInBackground(t, "controllers", mgr.Start)

	// The watching client: when each claim is first seen Bound.
	type seen struct {
		at         time.Time
		bindMillis int64
		enforced   bool
	}
	var mu sync.Mutex
	bound := map[string]seen{}
	boundCh := make(chan string, 4*perKind)
	// And when each claim's egress policy is first seen, and first seen
	// reported in force by the node: where an egress bind's time goes.
	policyCreated, policyReported := map[string]time.Time{}, map[string]time.Time{}
	env.WatchNamespace(t, ns, &kaironv1.MachineNetworkPolicyList{}, func(_ watch.EventType, o client.Object) {
		p := o.(*kaironv1.MachineNetworkPolicy)
		now := time.Now()
		claim := p.Labels[kaironv1.LabelMachineClaim]
		mu.Lock()
		defer mu.Unlock()
		if _, ok := policyCreated[claim]; !ok {
			policyCreated[claim] = now
		}
		for _, n := range p.Status.Nodes {
			if _, ok := policyReported[claim]; !ok && n.Node == nodeName && n.ObservedGeneration == p.Generation && slices.Contains(n.Machines, p.Spec.MachineName) {
				policyReported[claim] = now
			}
		}
	})
	env.WatchNamespace(t, ns, &kaironv1.MachineClaimList{}, func(_ watch.EventType, o client.Object) {
		c := o.(*kaironv1.MachineClaim)
		if c.Status.Phase != kaironv1.ClaimBound {
			return
		}
		now := time.Now()
		cond := meta.FindStatusCondition(c.Status.Conditions, kaironv1.ConditionEgressEnforced.String())
		mu.Lock()
		defer mu.Unlock()
		if _, ok := bound[c.Name]; ok {
			return
		}
		bound[c.Name] = seen{at: now, bindMillis: c.Status.BindMillis, enforced: cond != nil && cond.Status == metav1.ConditionTrue}
		boundCh <- c.Name
	})

	pool := &kaironv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "warm"},
		Spec: kaironv1.MachinePoolSpec{Replicas: ptr.To(warm), Template: kaironv1.MachineTemplateSpec{
			Metadata: kaironv1.MachineTemplateMeta{Labels: map[string]string{"app": "bench"}},
			Spec:     kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("64Mi")},
		}},
	}
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	waitWarm := func() {
		testenv.Eventually(t, 5*time.Minute, fmt.Sprintf("%d warm members", warm), func() (bool, string) {
			p := &kaironv1.MachinePool{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pool), p); err != nil {
				return false, err.Error()
			}
			return p.Status.ReadyWarm == warm, fmt.Sprintf("%d ready warm", p.Status.ReadyWarm)
		})
	}
	waitWarm()

	egress := &kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24"}, AllowPorts: []kaironv1.PortRange{"443"}}
	type result struct {
		bindMillis int64
		watched    time.Duration
		// Egress claims: create → policy seen → policy reported in force.
		policySeen, reported time.Duration
	}
	results := map[bool][]result{}
	writesBefore, latenciesBefore := apiWrites(t, env)
	for i := range 2 * perKind {
		if idle {
			waitWarm()
			// The refill's last writes (the pool's status, events) land
			// after the pool reads warm, and no object says when they
			// have: a pause, not a wait for a state.
			time.Sleep(300 * time.Millisecond)
		}
		withEgress := i%2 == 0
		c := &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("c%03d", i)}, Spec: kaironv1.MachineClaimSpec{PoolName: pool.Name}}
		if withEgress {
			c.Spec.Egress = egress.DeepCopy()
		}
		start := time.Now()
		if err := env.Client.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		for name := ""; name != c.Name; {
			select {
			case name = <-boundCh:
			case <-time.After(waitTimeout):
				t.Fatalf("claim %s not Bound within %v", c.Name, waitTimeout)
			}
		}
		mu.Lock()
		s := bound[c.Name]
		mu.Unlock()
		if s.enforced != withEgress {
			t.Fatalf("claim %s (egress %v) Bound with EgressEnforced %v", c.Name, withEgress, s.enforced)
		}
		r := result{bindMillis: s.bindMillis, watched: s.at.Sub(start)}
		if withEgress {
			mu.Lock()
			created, reported := policyCreated[c.Name], policyReported[c.Name]
			mu.Unlock()
			if created.IsZero() || reported.IsZero() {
				// The policy's events may trail the claim's by a moment.
				testenv.Eventually(t, waitTimeout, "the watch seeing "+c.Name+"'s policy reported", func() (bool, string) {
					mu.Lock()
					defer mu.Unlock()
					created, reported = policyCreated[c.Name], policyReported[c.Name]
					return !created.IsZero() && !reported.IsZero(), ""
				})
			}
			r.policySeen, r.reported = created.Sub(start), reported.Sub(start)
		}
		results[withEgress] = append(results[withEgress], r)
	}

	// What the API server wrote for them, refills included.
	writesAfter, latenciesAfter := apiWrites(t, env)
	total, kinds := testenv.RequestsSince(writesBefore, writesAfter, 2*perKind, 8)
	t.Logf("API writes per claim over the %d claims (their refills included): %.2f; %s", 2*perKind, total/float64(2*perKind), kinds)
	t.Logf("the API server's own time for those writes: %s", testenv.LatenciesSince(latenciesBefore, latenciesAfter, float64(perKind)/2))

	// The rules were in the kernel: one chain per bound egress claim.
	out, err := exec.Command("ip", "netns", "exec", netns, "nft", "list", "table", "bridge", "kairon_egress").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	t.Logf("bridge kairon_egress chains in the node namespace: %d", strings.Count(string(out), "chain e_"))

	var samples []bindSample
	for withEgress, rs := range results {
		for _, r := range rs {
			samples = append(samples, bindSample{run: ns, egress: withEgress, bindMillis: r.bindMillis, watched: r.watched})
		}
	}
	r := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
	egressBind, plainBind := splitSorted(samples, byBindMillis)
	egressWatched, plainWatched := splitSorted(samples, byWatch)
	mode := "back to back"
	if idle {
		mode = "each on an idle, fully warm pool"
	}
	t.Logf("%d claims of each kind, alternating, %s; p99 is the %d-th fastest of %d", perKind, mode, (perKind-1)*99/100+1, perKind)
	t.Logf("| measure | without egress p50 / p99 / max | with egress p50 / p99 / max | egress adds (p50 / p99) |")
	t.Logf("| --- | --- | --- | --- |")
	for _, m := range []struct {
		name       string
		plain, egr []time.Duration
	}{{"status.bindMillis", plainBind, egressBind}, {"create → Bound (watch)", plainWatched, egressWatched}} {
		t.Logf("| %s | %s / %s / %s | %s / %s / %s | %s / %s |", m.name,
			r(percentile(m.plain, 50)), r(percentile(m.plain, 99)), r(m.plain[len(m.plain)-1]),
			r(percentile(m.egr, 50)), r(percentile(m.egr, 99)), r(m.egr[len(m.egr)-1]),
			r(percentile(m.egr, 50)-percentile(m.plain, 50)), r(percentile(m.egr, 99)-percentile(m.plain, 99)))
	}
	if path := os.Getenv("KAIRON_EGRESS_BENCH_SAMPLES"); path != "" {
		reportPooled(t, path, samples)
	}
	// Where an egress claim's time goes, each step's p50 / p99 / max.
	var created, enforce, after []time.Duration
	for _, e := range results[true] {
		created = append(created, e.policySeen)
		enforce = append(enforce, e.reported-e.policySeen)
		after = append(after, e.watched-e.reported)
	}
	for _, xs := range [][]time.Duration{created, enforce, after} {
		slices.Sort(xs)
	}
	three := func(xs []time.Duration) string {
		return r(percentile(xs, 50)) + " / " + r(percentile(xs, 99)) + " / " + r(xs[len(xs)-1])
	}
	t.Logf("egress claims, seen by the watch: create → policy created %s; → policy reported in force by the node %s; → claim Bound %s",
		three(created), three(enforce), three(after))
	// The node's own steps over the whole run (refills' unconfined
	// Machines included), from its histograms.
	for _, name := range []string{"kairon_egress_apply_duration_seconds", "kairon_egress_report_duration_seconds"} {
		t.Logf("%s{node=%s}: %s", name, nodeName, histogramSummary(t, name, nodeName))
	}
}

// TestEgressBindPooledReport logs the pooled figures of a samples file
// that runs of TestEgressBindLatency wrote, without running any:
// KAIRON_EGRESS_BENCH_REPORT=<file>.
func TestEgressBindPooledReport(t *testing.T) {
	path := os.Getenv("KAIRON_EGRESS_BENCH_REPORT")
	if path == "" {
		t.Skip("reads a samples file: KAIRON_EGRESS_BENCH_REPORT=<file> runs it")
	}
	samples, err := readBindSamples(path)
	if err != nil {
		t.Fatalf("KAIRON_EGRESS_BENCH_REPORT: %v", err)
	}
	for _, line := range pooledReport(samples) {
		t.Log(line)
	}
}

// reportPooled appends this run's claims to the samples file at path and
// logs what the claims of every run there say together.
func reportPooled(t *testing.T, path string, samples []bindSample) {
	t.Helper()
	if err := appendBindSamples(path, samples); err != nil {
		t.Fatalf("KAIRON_EGRESS_BENCH_SAMPLES: %v", err)
	}
	all, err := readBindSamples(path)
	if err != nil {
		t.Fatalf("KAIRON_EGRESS_BENCH_SAMPLES: %v", err)
	}
	for _, line := range pooledReport(all) {
		t.Log(line)
	}
}

// histogramSummary is the count and mean of the histogram name for node,
// and how many observations took over 25, 50 and 100 ms.
func histogramSummary(t *testing.T, name, node string) string {
	t.Helper()
	h := nodeHistogram(t, name, node)
	n := h.GetSampleCount()
	if n == 0 {
		return "none"
	}
	out := fmt.Sprintf("%d, mean %.1f ms", n, 1000*h.GetSampleSum()/float64(n))
	for _, b := range h.GetBucket() {
		if le := b.GetUpperBound(); le == 0.025 || le == 0.05 || le == 0.1 {
			out += fmt.Sprintf(", over %.0f ms %d", 1000*le, n-b.GetCumulativeCount())
		}
	}
	return out
}

// apiWrites is the API server's write requests so far, and its timing of
// them, from one reading of its /metrics.
func apiWrites(t *testing.T, env *testenv.Env) (map[string]float64, map[string]testenv.RequestLatency) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	m, err := testenv.ReadAPIMetrics(context.Background(), cs.Discovery().RESTClient())
	if err != nil {
		t.Fatal(err)
	}
	w, err := m.Requests(testenv.IsWrite)
	if err != nil {
		t.Fatal(err)
	}
	l, err := m.Latencies(testenv.IsWrite)
	if err != nil {
		t.Fatal(err)
	}
	return w, l
}
