package controller

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
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

// A pool with spec.warmFrom Snapshot (on the real API server, sim nodes):
// its template Machine is booted, saved by its node and stopped, and never
// counts as a member; members created once the snapshot exists are clones,
// restored on the template's node (one on another node fails); a claim binds to a clone, and its
// replacement is a clone too; a template change re-snapshots (the old
// template Machine and its file go) and the next replacement is a clone of
// the new template; warmFrom Boot drops the template and its file.
func TestMachinePoolWarmFromSnapshot(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	runSimAgent(t, env, ns, "a", "10.90.41.0/24", 16, "16Gi", simBootDelay)
	runSimAgent(t, env, ns, "b", "10.90.42.0/24", 16, "16Gi", simBootDelay)
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

	// A clone on a node without the file fails to start: the state is not
	// copied between nodes.
	other := ns + "-a"
	if snap.NodeName == other {
		other = ns + "-b"
	}
	createMachine(t, env, ns, "stray", 1, "64Mi", func(m *kaironv1.Machine) {
		m.Annotations = map[string]string{kaironv1.AnnotationRestoreFrom: snap.Machine}
		m.Spec.NodeName = other
	})
	eventually(t, "a clone on the other node to fail", func() (bool, string) {
		m := getMachine(t, env, ns, "stray")
		return m.Status.Phase == kaironv1.MachineFailed && strings.Contains(m.Status.Message, "is not on node "+other), fmtJSON(m.Status)
	})

	scalePool(t, env, ns, "agents", 2)
	warm := waitWarm(t, env, ns, "agents", 2, 0)
	isClone := func(m *kaironv1.Machine, s *kaironv1.MachinePoolSnapshot) bool {
		return m.Annotations[kaironv1.AnnotationRestoreFrom] == s.Machine && m.Spec.NodeName == s.NodeName
	}
	for i := range warm {
		if !isClone(&warm[i], snap) {
			t.Errorf("member %s is no clone of %s: annotations %v node %s", warm[i].Name, snap.Machine, warm[i].Annotations, warm[i].Spec.NodeName)
		}
	}

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
