package controller

import (
	"context"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
)

// waitSnapshot waits until the pool's SnapshotReady condition is True for
// hash and returns its status.snapshot.
func waitSnapshot(t *testing.T, env *testenv.Env, ns, pool, hash string) *kaironv1.MachinePoolSnapshot {
	t.Helper()
	var snap *kaironv1.MachinePoolSnapshot
	eventually(t, "pool "+pool+" to have a snapshot of template "+hash, func() (bool, string) {
		p := getPool(t, env, ns, pool)
		snap = p.Status.Snapshot
		c := meta.FindStatusCondition(p.Status.Conditions, kaironv1.ConditionSnapshotReady.String())
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == kaironv1.SnapshotReasonSaved &&
			snap != nil && snap.TemplateHash == hash, fmtJSON(p.Status)
	})
	return snap
}

// runCloneAgent is runSimAgent with the agent's migration listener on
// loopback (plain TCP, --migration-insecure), over which a node fetches the
// template of a clone placed on it from the template's node; the
// controller's endpoint controller publishes it. It returns the node's
// name and state directory.
func runCloneAgent(t *testing.T, env *testenv.Env, ns, name, cidr string) (nodeName, state string) {
	t.Helper()
	state = t.TempDir()
	b, err := sim.New(sim.Options{StateDir: filepath.Join(state, "instances"), BootDelay: simBootDelay})
	if err != nil {
		t.Fatal(err)
	}
	nodeName = ns + "-" + name
	agent, err := node.New(env.Config, node.Options{
		NodeName: nodeName, Register: true, Backend: b, StateDir: state,
		CPU: 16, Memory: resource.MustParse("16Gi"),
		Network:                &node.NetworkOptions{CIDR: netip.MustParsePrefix(cidr), NoLinks: true},
		Interval:               30 * time.Second,
		MigrationListenAddress: "127.0.0.1:0", MigrationInsecure: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting node %s: %v", nodeName, err)
		}
	})
	testenv.RunInBackground(t, "agent "+nodeName, agent.Run)
	return nodeName, state
}

// fetchedTemplates lists the template copies a node fetched.
func fetchedTemplates(state string) []string {
	files, _ := filepath.Glob(filepath.Join(state, "fetched-templates", "*.state"))
	return files
}

// A pool with spec.warmFrom Snapshot (on the real API server, sim nodes):
// its template Machine is booted, saved by its node and stopped, and never
// counts as a member; members created once the snapshot exists are clones,
// not pinned to the template's node: with that node cordoned they run on
// the other one, which fetched the template's file (as for a clone put
// there by hand); a claim binds to a clone, and its replacement is a clone
// too; a template change re-snapshots (the old template Machine and its
// file go, and so does the other node's copy) and the next replacement is
// a clone of the new template; warmFrom Boot drops the template and its
// file.
func TestMachinePoolWarmFromSnapshot(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	nodeA, stateA := runCloneAgent(t, env, ns, "a", "10.90.41.0/24")
	nodeB, stateB := runCloneAgent(t, env, ns, "b", "10.90.42.0/24")
	startControllers(t, env, ns, Options{})
	pool := &kaironv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agents"},
		Spec:       kaironv1.MachinePoolSpec{Replicas: ptr.To(int32(0)), Template: poolTemplate(), WarmFrom: kaironv1.WarmFromSnapshot},
	}
	if err := env.Client.Create(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	hash := templateHash(&pool.Spec.Template)
	snap := waitSnapshot(t, env, ns, "agents", hash)
	tmpl := getMachine(t, env, ns, snap.Machine)
	if tmpl.Labels[kaironv1.LabelMachinePoolTemplate] != "agents" || tmpl.Labels[kaironv1.LabelMachinePool] != "" ||
		tmpl.Status.Phase != kaironv1.MachineStopped || tmpl.Spec.NodeName != snap.NodeName ||
		tmpl.Status.Snapshot == nil || tmpl.Status.Snapshot.Path != snap.Path || snap.SizeBytes <= 0 || snap.TakenAt == nil {
		t.Errorf("template machine %s: labels %v phase %s node %s status.snapshot %s; pool's %s", tmpl.Name, tmpl.Labels,
			tmpl.Status.Phase, tmpl.Spec.NodeName, fmtJSON(tmpl.Status.Snapshot), fmtJSON(snap))
	}
	if c := meta.FindStatusCondition(tmpl.Status.Conditions, kaironv1.ConditionReady.String()); c == nil || c.Reason != kaironv1.MachineReasonSnapshotSaved {
		t.Errorf("template machine Ready condition %+v", c)
	}
	if _, err := os.Stat(snap.Path); err != nil {
		t.Errorf("the snapshot file: %v", err)
	}

	// A clone put by hand on the node without the file runs: that node
	// fetches the file from the template's.
	other, otherState := nodeA, stateA
	if snap.NodeName == nodeA {
		other, otherState = nodeB, stateB
	}
	createMachine(t, env, ns, "stray", 1, "64Mi", func(m *kaironv1.Machine) {
		m.Annotations = map[string]string{kaironv1.AnnotationRestoreFrom: snap.Machine}
		m.Spec.NodeName = other
	})
	eventually(t, "a clone on the other node to run", func() (bool, string) {
		m := getMachine(t, env, ns, "stray")
		return m.Status.Phase == kaironv1.MachineRunning, fmtJSON(m.Status)
	})
	if copies := fetchedTemplates(otherState); len(copies) != 1 {
		t.Errorf("template copies on %s: %v, want one", other, copies)
	}
	if err := env.Client.Delete(context.Background(), getMachine(t, env, ns, "stray")); err != nil {
		t.Fatal(err)
	}

	// The pool's clones go where there is room: with the template's node
	// cordoned, on the other one.
	cordon(t, env, snap.NodeName, true)
	scalePool(t, env, ns, "agents", 2)
	warm := waitWarm(t, env, ns, "agents", 2, 0)
	isClone := func(m *kaironv1.Machine, s *kaironv1.MachinePoolSnapshot) bool {
		return m.Annotations[kaironv1.AnnotationRestoreFrom] == s.Machine && m.Spec.NodeSelector[corev1.LabelHostname] == ""
	}
	for i := range warm {
		if !isClone(&warm[i], snap) || warm[i].Spec.NodeName != other {
			t.Errorf("member %s is no clone of %s running on %s: annotations %v nodeSelector %v node %s", warm[i].Name, snap.Machine, other,
				warm[i].Annotations, warm[i].Spec.NodeSelector, warm[i].Spec.NodeName)
		}
	}
	cordon(t, env, snap.NodeName, false)

	createClaim(t, env, ns, "job", "agents")
	bound := waitClaimBound(t, env, ns, "job")
	if m := getMachine(t, env, ns, bound.Status.MachineName); !isClone(m, snap) {
		t.Errorf("the claim bound %s, no clone: annotations %v", m.Name, m.Annotations)
	}
	for _, m := range waitWarm(t, env, ns, "agents", 2, 1) {
		if !isClone(&m, snap) {
			t.Errorf("replacement %s is no clone: annotations %v", m.Name, m.Annotations)
		}
	}

	p := getPool(t, env, ns, "agents")
	patch := client.MergeFrom(p.DeepCopy())
	p.Spec.Template.Spec.Memory = resource.MustParse("96Mi")
	if err := env.Client.Patch(context.Background(), p, patch); err != nil {
		t.Fatal(err)
	}
	newHash := templateHash(&p.Spec.Template)
	newSnap := waitSnapshot(t, env, ns, "agents", newHash)
	if newSnap.Machine == snap.Machine || newSnap.Path == snap.Path {
		t.Errorf("the template change did not re-snapshot: %s then %s", fmtJSON(snap), fmtJSON(newSnap))
	}
	eventually(t, "the old template machine and its file to go", func() (bool, string) {
		var m kaironv1.Machine
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: snap.Machine}, &m)
		_, statErr := os.Stat(snap.Path)
		return err != nil && errors.Is(statErr, fs.ErrNotExist), fmtJSON(m.Status)
	})
	// The other node's copy of the old template goes with it (its sweep
	// runs every 15 s).
	testenv.Eventually(t, 2*time.Minute, "the copy of the old template on "+other+" to go", func() (bool, string) {
		for _, f := range fetchedTemplates(otherState) {
			if strings.Contains(filepath.Base(f), "_"+snap.Machine+".") {
				return false, f
			}
		}
		return true, ""
	})
	// Members that replaced the stale ones while the new template was
	// saving booted; the replacement of the next bind is a clone.
	createClaim(t, env, ns, "job2", "agents")
	waitClaimBound(t, env, ns, "job2")
	eventually(t, "the replacement to be a clone of the new template", func() (bool, string) {
		warm, claimed := poolMachines(t, env, ns, "agents")
		clones := 0
		ok := len(warm) == 2 && countRunning(warm) == 2 && len(claimed) == 2
		for i := range warm {
			ok = ok && warm[i].Spec.Memory.String() == "96Mi"
			if isClone(&warm[i], newSnap) {
				clones++
			}
		}
		return ok && clones >= 1, describeMembers(warm, claimed)
	})

	// Back to booting: the template Machine, its file and the pool's
	// snapshot record go.
	p = getPool(t, env, ns, "agents")
	patch = client.MergeFrom(p.DeepCopy())
	p.Spec.WarmFrom = kaironv1.WarmFromBoot
	if err := env.Client.Patch(context.Background(), p, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, "warmFrom Boot to drop the snapshot", func() (bool, string) {
		p := getPool(t, env, ns, "agents")
		var m kaironv1.Machine
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: newSnap.Machine}, &m)
		_, statErr := os.Stat(newSnap.Path)
		return p.Status.Snapshot == nil && meta.FindStatusCondition(p.Status.Conditions, kaironv1.ConditionSnapshotReady.String()) == nil &&
			err != nil && errors.Is(statErr, fs.ErrNotExist), fmtJSON(p.Status)
	})
}
