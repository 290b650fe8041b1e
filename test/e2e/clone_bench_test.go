package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// cloneBenchEnv turns TestCloneBench on; it is a measurement, not a check.
const cloneBenchEnv = "KAIRON_CLONE_BENCH"

// TestCloneBench measures snapshot clones against cold boots with real VMs
// (kairon-controller and one kairon-node with QEMU, TCG on this machine),
// both in one run, one after the other on the same node; then clones on a
// second node that has no copy of the template (Snapshot, other node: the
// template is saved on the first node, which is then cordoned, so the
// second node fetches the state once and restores every clone from its
// copy):
//
//   - refill: a pool scaled from 0 to cloneBenchRefill members, the time
//     until all are Running (members/s) and each member's create ->
//     Running;
//   - a claim against an empty pool: a pool of one warm member takes two
//     claims at once; the second waits for the refill, create -> Bound.
//
// For Snapshot the pool's template is booted and saved first (timed too).
//
//	KAIRON_CLONE_BENCH=1 KAIRON_BIN_DIR=$PWD/bin go test -count=1 -timeout 30m -run TestCloneBench -v ./test/e2e/
func TestCloneBench(t *testing.T) {
	if os.Getenv(cloneBenchEnv) == "" {
		t.Skipf("a measurement; set %s=1 (make bench-clone)", cloneBenchEnv)
	}
	env := testenv.Get(t)
	ns := env.Namespace(t)
	netNS := netns(t)
	state := t.TempDir()
	t.Cleanup(func() { killVMs(t, state) })
	startController(t, env)
	// One bridge range for both nodes, an address pool each; the second
	// node fetches the template's state over the migration listener.
	agentFlags := func(i int) []string {
		return []string{"--network-cidr", "10.88.0.0/16", "--address-pool", fmt.Sprintf("10.88.%d.0/24", 40+i),
			"--migration-listen", "127.0.0.1:0", "--migration-insecure"}
	}
	startAgentWith(t, env, "bench-clone", filepath.Join(state, "a"), netNS, 8, "4Gi", agentFlags(0)...)
	deleteNodeAtEnd(t, env, "bench-clone")
	waitNodeReady(t, env, "bench-clone")
	t.Logf("load average before: %s", loadAvg())
	t.Cleanup(func() { t.Logf("load average after: %s", loadAvg()) })

	results := map[string][]string{}
	results["Boot"] = cloneBenchMode(t, env, ns, "Boot", "boot", nil)
	results["Snapshot"] = cloneBenchMode(t, env, ns, "Snapshot", "snapshot", nil)
	var b *agent
	results["Snapshot, other node"] = cloneBenchMode(t, env, ns, "Snapshot", "crossnode", func() {
		env.Kubectl(t, "cordon", "bench-clone")
		b = startAgentWith(t, env, "bench-clone-b", filepath.Join(state, "b"), netNS, 8, "4Gi", agentFlags(1)...)
		deleteNodeAtEnd(t, env, "bench-clone-b")
		waitNodeReady(t, env, "bench-clone-b")
	})
	results["Snapshot, other node"] = append(results["Snapshot, other node"], fetchesLogged(t, b.log)...)
	for _, mode := range []string{"Boot", "Snapshot", "Snapshot, other node"} {
		t.Logf("warmFrom %s:", mode)
		for _, line := range results[mode] {
			t.Logf("  %s", line)
		}
	}
}

const (
	cloneBenchRefill = 4
	cloneBenchRounds = 5
)

// cloneBenchMode measures pool (warmFrom mode); afterSnapshot, if not
// nil, runs once the template is saved, before the refill.
func cloneBenchMode(t *testing.T, env *testenv.Env, ns, mode, pool string, afterSnapshot func()) []string {
	ctx := context.Background()
	var out []string
	start := time.Now()
	env.KubectlStdin(t, clonePool(pool, mode, 0), "-n", ns, "apply", "-f", "-")
	if mode == "Snapshot" {
		snap := waitPoolSnapshot(t, env, ns, pool)
		out = append(out, fmt.Sprintf("template booted and saved on %s %s after the pool was created (%d MiB state)",
			snap.NodeName, time.Since(start).Round(time.Millisecond), snap.SizeBytes>>20))
	}
	if afterSnapshot != nil {
		afterSnapshot()
	}

	// Refill: 0 -> cloneBenchRefill.
	scale := func(n int) {
		p := &kaironv1.MachinePool{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: pool}, p); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(p.DeepCopy())
		p.Spec.Replicas = ptr.To(int32(n))
		if err := env.Client.Patch(ctx, p, patch); err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	scale(cloneBenchRefill)
	running := map[string]time.Duration{}
	nodes := map[string]int{}
	testenv.Eventually(t, 5*time.Minute, fmt.Sprintf("%d Running members of %s", cloneBenchRefill, pool), func() (bool, string) {
		list := &kaironv1.MachineList{}
		if err := env.Client.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{kaironv1.LabelMachinePool: pool}); err != nil {
			return false, err.Error()
		}
		for _, m := range list.Items {
			if _, seen := running[m.Name]; !seen && m.Status.Phase == kaironv1.MachineRunning {
				running[m.Name] = time.Since(start)
				nodes[m.Spec.NodeName]++
			}
		}
		return len(running) >= cloneBenchRefill, fmt.Sprint(len(running))
	})
	all := time.Since(start)
	var each []time.Duration
	for _, d := range running {
		each = append(each, d)
	}
	out = append(out, fmt.Sprintf("refill 0 -> %d: all Running after %s, %.2f members/s; each scale -> Running: %s; on nodes %v",
		cloneBenchRefill, all.Round(time.Millisecond), float64(cloneBenchRefill)/all.Seconds(), summary(each), nodes))

	// A claim against an empty pool: one warm member, two claims.
	scale(1)
	warmMembers(t, env, ns, pool, 1, 5*time.Minute)
	var emptyClaims, bootMillis []time.Duration
	for i := range cloneBenchRounds {
		first, second := fmt.Sprintf("%s-a%d", pool, i), fmt.Sprintf("%s-b%d", pool, i)
		for _, name := range []string{first, second} {
			c := &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kaironv1.MachineClaimSpec{PoolName: pool}}
			start = time.Now()
			if err := env.Client.Create(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
		var bound *kaironv1.MachineClaim
		testenv.Eventually(t, 5*time.Minute, second+" Bound", func() (bool, string) {
			c := &kaironv1.MachineClaim{}
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: second}, c); err != nil {
				return false, err.Error()
			}
			bound = c
			return c.Status.Phase == kaironv1.ClaimBound, string(c.Status.Phase)
		})
		emptyClaims = append(emptyClaims, time.Since(start))
		m := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: bound.Status.MachineName}, m); err == nil {
			bootMillis = append(bootMillis, time.Duration(m.Status.BootMillis)*time.Millisecond)
		}
		for _, name := range []string{first, second} {
			err := env.Client.Delete(ctx, &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
		waitClaimedGone(t, env, ns, pool)
		warmMembers(t, env, ns, pool, 1, 5*time.Minute)
	}
	out = append(out, fmt.Sprintf("claim against an empty pool, create -> Bound: %s", summary(emptyClaims)))
	out = append(out, fmt.Sprintf("that member's status.bootMillis (node: VM start -> ready): %s", summary(bootMillis)))

	env.Kubectl(t, "-n", ns, "delete", "machinepool", pool, "--wait=true", "--timeout=2m")
	testenv.Eventually(t, 2*time.Minute, "every Machine of "+pool+" deleted", func() (bool, string) {
		list := &kaironv1.MachineList{}
		_ = env.Client.List(ctx, list, client.InNamespace(ns))
		return len(list.Items) == 0, fmt.Sprint(len(list.Items))
	})
	return out
}

// waitClaimedGone waits until the pool has no claimed member left.
func waitClaimedGone(t *testing.T, env *testenv.Env, ns, pool string) {
	t.Helper()
	testenv.Eventually(t, 2*time.Minute, "claimed members of "+pool+" deleted", func() (bool, string) {
		list := &kaironv1.MachineList{}
		if err := env.Client.List(context.Background(), list, client.InNamespace(ns), client.MatchingLabels{
			kaironv1.LabelMachinePool: pool, kaironv1.LabelPoolState: kaironv1.PoolStateClaimed,
		}); err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprint(len(list.Items))
	})
}

// fetchesLogged reports the template fetches an agent logged: how many
// and how long each took (the node's "fetched template snapshot" lines).
func fetchesLogged(t *testing.T, log string) []string {
	t.Helper()
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		var entry struct {
			Msg   string  `json:"msg"`
			Bytes int64   `json:"bytes"`
			Took  float64 `json:"took"` // the agent's JSON log gives durations in seconds
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "fetched template snapshot from its node" {
			took := time.Duration(entry.Took * float64(time.Second))
			out = append(out, fmt.Sprintf("template state fetched from the template's node: %d MiB in %s", entry.Bytes>>20, took.Round(time.Millisecond)))
		}
	}
	return append(out, fmt.Sprintf("%d fetch(es) for all the clones on the node", len(out)))
}
