package controller

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
)

// simBootDelay is how long a hollow Machine boots in these tests.
const simBootDelay = 300 * time.Millisecond

// prepareNamespace creates the test's namespace and, to run when the test
// has stopped its controllers and agents, strips the finalizers left on
// its Machines and claims, so the namespace can go away behind it.
func prepareNamespace(t *testing.T, env *testenv.Env) string {
	t.Helper()
	ns := env.Namespace(t)
	t.Cleanup(func() { env.StripFinalizers(ns) })
	return ns
}

// runSimAgent runs an in-process kairon-node with the sim backend that
// registers a Node named <ns>-<name>, until the test ends.
func runSimAgent(t *testing.T, env *testenv.Env, ns, name, cidr string, cpu int64, memory string, bootDelay time.Duration) string {
	t.Helper()
	state := t.TempDir()
	backend, err := sim.New(sim.Options{StateDir: filepath.Join(state, "instances"), BootDelay: bootDelay})
	if err != nil {
		t.Fatal(err)
	}
	// The agent learns of boots from its instance poller; a short tick
	// would only have it re-check hundreds of Machines every second.
	return runAgentWith(t, env, ns, name, cidr, cpu, memory, backend, state, 30*time.Second)
}

// runAgentWith is runSimAgent over a backend of the caller's, with its
// state directory and reconcile tick.
func runAgentWith(t *testing.T, env *testenv.Env, ns, name, cidr string, cpu int64, memory string, backend backend.Backend, state string, interval time.Duration) string {
	t.Helper()
	nodeName := ns + "-" + name
	agent, err := node.New(env.Config, node.Options{
		NodeName: nodeName, Register: true, Backend: backend, StateDir: state,
		CPU: cpu, Memory: resource.MustParse(memory),
		Network:  &node.NetworkOptions{CIDR: netip.MustParsePrefix(cidr), NoLinks: true},
		Interval: interval,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after the agent stopped and cannot
	// recreate the Node with a heartbeat.
	t.Cleanup(func() {
		err := env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting node %s: %v", nodeName, err)
		}
	})
	testenv.RunInBackground(t, "agent "+nodeName, agent.Run)
	return nodeName
}

func poolTemplate() kaironv1.MachineTemplateSpec {
	return kaironv1.MachineTemplateSpec{
		Metadata: kaironv1.MachineTemplateMeta{Labels: map[string]string{"app": "agent"}},
		Spec:     kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("64Mi")},
	}
}

func createPool(t *testing.T, env *testenv.Env, ns, name string, replicas int32) *kaironv1.MachinePool {
	t.Helper()
	pool := &kaironv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       kaironv1.MachinePoolSpec{Replicas: ptr.To(replicas), Template: poolTemplate()},
	}
	if err := env.Client.Create(context.Background(), pool); err != nil {
		t.Fatalf("creating pool %s: %v", name, err)
	}
	return pool
}

func getPool(t *testing.T, env *testenv.Env, ns, name string) *kaironv1.MachinePool {
	t.Helper()
	return getObject[kaironv1.MachinePool](t, env, ns, name)
}

func scalePool(t *testing.T, env *testenv.Env, ns, name string, replicas int32) {
	t.Helper()
	pool := getPool(t, env, ns, name)
	patch := client.MergeFrom(pool.DeepCopy())
	pool.Spec.Replicas = ptr.To(replicas)
	if err := env.Client.Patch(context.Background(), pool, patch); err != nil {
		t.Fatalf("scaling pool %s: %v", name, err)
	}
}

// poolMachines lists the live (not terminating) members of a pool, warm
// and claimed, oldest first.
func poolMachines(t *testing.T, env *testenv.Env, ns, pool string) (warm, claimed []kaironv1.Machine) {
	t.Helper()
	all := listMachines(t, env, ns, client.MatchingLabels{kaironv1.LabelMachinePool: pool})
	sort.Slice(all, func(i, j int) bool {
		if !all[i].CreationTimestamp.Equal(&all[j].CreationTimestamp) {
			return all[i].CreationTimestamp.Before(&all[j].CreationTimestamp)
		}
		return all[i].Name < all[j].Name
	})
	for _, m := range all {
		if m.DeletionTimestamp != nil {
			continue
		}
		switch m.Labels[kaironv1.LabelPoolState] {
		case kaironv1.PoolStateWarm:
			warm = append(warm, m)
		case kaironv1.PoolStateClaimed:
			claimed = append(claimed, m)
		}
	}
	return warm, claimed
}

func names(machines []kaironv1.Machine) []string {
	var out []string
	for _, m := range machines {
		out = append(out, m.Name)
	}
	return out
}

func describeMembers(warm, claimed []kaironv1.Machine) string {
	var parts []string
	for _, m := range warm {
		parts = append(parts, fmt.Sprintf("%s(warm,%s,%s)", m.Name, m.Status.Phase, m.Labels[kaironv1.LabelMachinePoolTemplateHash]))
	}
	for _, m := range claimed {
		parts = append(parts, fmt.Sprintf("%s(claimed by %s,%s)", m.Name, m.Labels[kaironv1.LabelMachineClaim], m.Status.Phase))
	}
	return strings.Join(parts, " ")
}

func countRunning(machines []kaironv1.Machine) int {
	n := 0
	for _, m := range machines {
		if m.Status.Phase == kaironv1.MachineRunning {
			n++
		}
	}
	return n
}

// waitWarm waits until the pool has exactly want warm members, all
// Running, and its status says so.
func waitWarm(t *testing.T, env *testenv.Env, ns, pool string, want, claimed int) []kaironv1.Machine {
	t.Helper()
	var warm []kaironv1.Machine
	eventually(t, fmt.Sprintf("pool %s to have %d Running warm and %d claimed members", pool, want, claimed), func() (bool, string) {
		var c []kaironv1.Machine
		warm, c = poolMachines(t, env, ns, pool)
		p := getPool(t, env, ns, pool)
		s := p.Status
		ok := len(warm) == want && countRunning(warm) == want && len(c) == claimed &&
			s.Replicas == int32(want) && s.Warm == int32(want) && s.ReadyWarm == int32(want) && s.Claimed == int32(claimed) &&
			s.ObservedGeneration == p.Generation
		return ok, describeMembers(warm, c) + " status " + fmtJSON(s)
	})
	return warm
}

// The pool creates its members from the template with the pool labels and
// itself as controller, keeps spec.replicas of them Running, reports them in
// status and metrics, and through /scale follows kubectl scale.
func TestMachinePoolKeepsWarmMembers(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	runSimAgent(t, env, ns, "a", "10.90.1.0/24", 16, "16Gi", simBootDelay)
	startControllers(t, env, ns, Options{})
	pool := createPool(t, env, ns, "agents", 2)

	warm := waitWarm(t, env, ns, "agents", 2, 0)
	hash := templateHash(&getPool(t, env, ns, "agents").Spec.Template)
	if len(hash) == 0 || len(hash) > 10 {
		t.Errorf("template hash %q is not short", hash)
	}
	nameFormat := regexp.MustCompile(`^agents-[0-9a-f]{8}$`)
	for _, m := range warm {
		ref := metav1.GetControllerOf(&m)
		if !nameFormat.MatchString(m.Name) || m.Labels[kaironv1.LabelMachinePool] != "agents" ||
			m.Labels[kaironv1.LabelMachinePoolTemplateHash] != hash || m.Labels[kaironv1.LabelPoolState] != kaironv1.PoolStateWarm ||
			m.Labels["app"] != "agent" || m.Labels[kaironv1.LabelMachineClaim] != "" ||
			ref == nil || ref.UID != pool.UID || ref.Kind != "MachinePool" || m.Spec.Memory.String() != "64Mi" || m.Spec.NodeName == "" {
			t.Errorf("member not built from the template: %s labels %v owner %+v spec %+v", m.Name, m.Labels, ref, m.Spec)
		}
	}
	p := getPool(t, env, ns, "agents")
	if p.Status.Selector != "kairon.zyvor.dev/machinepool=agents,kairon.zyvor.dev/pool-state=warm" {
		t.Errorf("status.selector = %q", p.Status.Selector)
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, kaironv1.ConditionReady.String()); c == nil || c.Status != metav1.ConditionTrue ||
		c.Reason != kaironv1.PoolReasonWarmMachinesReady || c.Message != "2/2 warm machines Running" {
		t.Errorf("Ready condition %+v", c)
	}
	// Zero counts are written too, so kubectl prints 0, not a blank.
	if out := env.Kubectl(t, "-n", ns, "get", "machinepool", "agents", "-o", "jsonpath={.status.claimed}"); out != "0" {
		t.Errorf("status.claimed printed as %q, want 0", out)
	}
	if got := testutil.ToFloat64(poolMembers.WithLabelValues(ns, "agents", memberStateWarm)); got != 2 {
		t.Errorf("kairon_machinepool_members{state=warm} = %v, want 2", got)
	}

	env.Kubectl(t, "-n", ns, "scale", "machinepool", "agents", "--replicas", "3")
	waitWarm(t, env, ns, "agents", 3, 0)
	env.Kubectl(t, "-n", ns, "scale", "machinepool", "agents", "--replicas", "1")
	waitWarm(t, env, ns, "agents", 1, 0)
	if got := testutil.ToFloat64(poolMembers.WithLabelValues(ns, "agents", memberStateWarm)); got != 1 {
		t.Errorf("kairon_machinepool_members{state=warm} = %v after scaling to 1, want 1", got)
	}
}

// Changing the template deletes and recreates the warm members at once;
// the claimed member, built from the old template, stays as it is.
func TestMachinePoolTemplateChangeReplacesWarmMembersOnly(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	runSimAgent(t, env, ns, "a", "10.90.2.0/24", 16, "16Gi", simBootDelay)
	startControllers(t, env, ns, Options{})
	createPool(t, env, ns, "agents", 2)
	oldWarm := waitWarm(t, env, ns, "agents", 2, 0)
	createClaim(t, env, ns, "job", "agents")
	bound := waitClaimBound(t, env, ns, "job")
	waitWarm(t, env, ns, "agents", 2, 1)
	oldHash := oldWarm[0].Labels[kaironv1.LabelMachinePoolTemplateHash]
	warmBefore, _ := poolMachines(t, env, ns, "agents")

	pool := getPool(t, env, ns, "agents")
	patch := client.MergeFrom(pool.DeepCopy())
	pool.Spec.Template.Spec.Memory = resource.MustParse("96Mi")
	pool.Spec.Template.Metadata.Labels["version"] = "2"
	if err := env.Client.Patch(context.Background(), pool, patch); err != nil {
		t.Fatal(err)
	}
	newHash := templateHash(&pool.Spec.Template)
	if newHash == oldHash {
		t.Fatalf("template hash did not change: %s", newHash)
	}

	eventually(t, "warm members rebuilt from the new template", func() (bool, string) {
		warm, claimed := poolMachines(t, env, ns, "agents")
		ok := len(warm) == 2 && countRunning(warm) == 2 && len(claimed) == 1
		for _, m := range warm {
			ok = ok && m.Labels[kaironv1.LabelMachinePoolTemplateHash] == newHash && m.Spec.Memory.String() == "96Mi" &&
				m.Labels["version"] == "2" && !slices.Contains(names(warmBefore), m.Name)
		}
		return ok, describeMembers(warm, claimed)
	})
	m := getMachine(t, env, ns, bound.Status.MachineName)
	if m.DeletionTimestamp != nil || m.Labels[kaironv1.LabelMachinePoolTemplateHash] != oldHash ||
		m.Labels[kaironv1.LabelPoolState] != kaironv1.PoolStateClaimed || m.Spec.Memory.String() != "64Mi" {
		t.Errorf("claimed machine was touched by the template change: %s labels %v memory %s", m.Name, m.Labels, m.Spec.Memory.String())
	}
	if c := getClaim(t, env, ns, "job"); c.Status.Phase != kaironv1.ClaimBound || c.Status.MachineName != m.Name {
		t.Errorf("claim after template change: %+v", c.Status)
	}
}

// Scaling down trims members that are not Running yet first, then the
// newest Running ones. Without a node agent here, the test plays it.
func TestMachinePoolTrimsBootingMembersFirst(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	createNode(t, env, ns, "n1", 16, "16Gi")
	startControllers(t, env, ns, Options{})
	createPool(t, env, ns, "agents", 2)
	eventually(t, "two members", func() (bool, string) {
		first, _ := poolMachines(t, env, ns, "agents")
		return len(first) == 2, describeMembers(first, nil)
	})
	scalePool(t, env, ns, "agents", 3)
	var all []kaironv1.Machine
	eventually(t, "three members", func() (bool, string) {
		all, _ = poolMachines(t, env, ns, "agents")
		return len(all) == 3, describeMembers(all, nil)
	})
	for i := range all {
		setMachinePhase(t, env, &all[i], kaironv1.MachineRunning)
	}
	// The newest Running member is the one with the latest
	// creationTimestamp and, within its second (all a timestamp tells),
	// the greatest name: the last that poolMachines lists. Whether the
	// third member's second differs from the first two's is up to the
	// clock; TestSurplusMachines covers both cases with set timestamps.
	newestRunning := all[len(all)-1].Name
	var keep []string
	for _, m := range all[:len(all)-1] {
		keep = append(keep, m.Name)
	}
	waitWarm(t, env, ns, "agents", 3, 0)

	scalePool(t, env, ns, "agents", 5)
	var five []kaironv1.Machine
	eventually(t, "five members", func() (bool, string) {
		five, _ = poolMachines(t, env, ns, "agents")
		return len(five) == 5, describeMembers(five, nil)
	})
	var booting []string
	for i, m := range five {
		if m.Status.Phase != kaironv1.MachineRunning {
			booting = append(booting, m.Name)
			if len(booting) == 1 {
				setMachinePhase(t, env, &five[i], kaironv1.MachineBooting)
			}
		}
	}

	scalePool(t, env, ns, "agents", 3)
	eventually(t, "the two booting members trimmed", func() (bool, string) {
		warm, _ := poolMachines(t, env, ns, "agents")
		got := names(warm)
		return len(got) == 3 && !slices.Contains(got, booting[0]) && !slices.Contains(got, booting[1]), describeMembers(warm, nil)
	})
	scalePool(t, env, ns, "agents", 2)
	eventually(t, "the newest Running member trimmed", func() (bool, string) {
		warm, _ := poolMachines(t, env, ns, "agents")
		got := names(warm)
		sort.Strings(got)
		want := slices.Clone(keep)
		sort.Strings(want)
		return slices.Equal(got, want), describeMembers(warm, nil) + " (newest Running was " + newestRunning + ")"
	})
}

// Deleting a pool deletes its warm members through the garbage collector;
// claimed Machines belong to their claims and stay, still bound.
func TestMachinePoolDeletionLeavesClaimedMachines(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	runSimAgent(t, env, ns, "a", "10.90.3.0/24", 16, "16Gi", simBootDelay)
	startControllers(t, env, ns, Options{})
	pool := createPool(t, env, ns, "agents", 2)
	waitWarm(t, env, ns, "agents", 2, 0)
	createClaim(t, env, ns, "job", "agents")
	claimed := waitClaimBound(t, env, ns, "job").Status.MachineName
	waitWarm(t, env, ns, "agents", 2, 1)

	if err := env.Client.Delete(context.Background(), pool, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the warm members collected", func() (bool, string) {
		left := listMachines(t, env, ns)
		return len(left) == 1 && left[0].Name == claimed && left[0].DeletionTimestamp == nil, strings.Join(names(left), ",")
	})
	testenv.Consistently(t, gcWindow, "the claimed machine to stay, Running", func() (bool, string) {
		m := getMachine(t, env, ns, claimed)
		return m.DeletionTimestamp == nil && m.Status.Phase == kaironv1.MachineRunning,
			fmt.Sprintf("claimed machine %s is going: phase %s deletion %v", m.Name, m.Status.Phase, m.DeletionTimestamp)
	})
	if c := getClaim(t, env, ns, "job"); c.Status.Phase != kaironv1.ClaimBound || c.Status.MachineName != claimed {
		t.Errorf("claim after pool deletion: %+v", c.Status)
	}
}

// The template hash is short, stable and changes with the template.
func TestMachinePoolTemplateHash(t *testing.T) {
	a, b := poolTemplate(), poolTemplate()
	if templateHash(&a) != templateHash(&b) {
		t.Error("equal templates hash differently")
	}
	b.Spec.CPU = 2
	if templateHash(&a) == templateHash(&b) {
		t.Error("different templates hash alike")
	}
	if h := templateHash(&a); !regexp.MustCompile(`^[a-z0-9]{1,10}$`).MatchString(h) {
		t.Errorf("hash %q is not a short label value", h)
	}
}

// histogramCount reads how many observations a histogram in
// controller-runtime's registry, the one kairon-controller serves on
// /metrics, has.
func histogramCount(t *testing.T, name string) uint64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("metric %s is not registered", name)
	return 0
}

// status.selector selects exactly the members status.replicas counts: the
// warm ones, never a claimed one. An autoscaler reading /scale averages a
// metric over the selected Machines and divides by status.replicas, so the
// two must agree.
func TestMachinePoolSelectorSelectsWhatReplicasCounts(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	runSimAgent(t, env, ns, "a", "10.90.9.0/24", 16, "16Gi", simBootDelay)
	startControllers(t, env, ns, Options{})
	createPool(t, env, ns, "agents", 2)
	waitWarm(t, env, ns, "agents", 2, 0)
	createClaim(t, env, ns, "job", "agents")
	bound := waitClaimBound(t, env, ns, "job")
	waitWarm(t, env, ns, "agents", 2, 1)

	ctx := context.Background()
	eventually(t, "status.selector to select exactly the status.replicas warm members", func() (bool, string) {
		p := getPool(t, env, ns, "agents")
		selector, err := labels.Parse(p.Status.Selector)
		if err != nil {
			return false, fmt.Sprintf("status.selector %q: %v", p.Status.Selector, err)
		}
		var selected kaironv1.MachineList
		if err := env.Client.List(ctx, &selected, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: selector}); err != nil {
			return false, err.Error()
		}
		got := names(selected.Items)
		if slices.Contains(got, bound.Status.MachineName) {
			return false, fmt.Sprintf("selector %q selects the claimed member %s", p.Status.Selector, bound.Status.MachineName)
		}
		return int32(len(got)) == p.Status.Replicas && p.Status.Replicas == 2 && p.Status.Claimed == 1,
			fmt.Sprintf("selector %q selects %v; status.replicas %d, claimed %d", p.Status.Selector, got, p.Status.Replicas, p.Status.Claimed)
	})
	// The scale subresource hands the same selector to an autoscaler.
	out := env.Kubectl(t, "-n", ns, "get", "--raw", fmt.Sprintf("/apis/kairon.zyvor.dev/v1alpha1/namespaces/%s/machinepools/agents/scale", ns))
	if !strings.Contains(out, `"selector":"kairon.zyvor.dev/machinepool=agents,kairon.zyvor.dev/pool-state=warm"`) || !strings.Contains(out, `"replicas":2`) {
		t.Errorf("scale subresource: %s", out)
	}
}
