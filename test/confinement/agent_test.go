package confinement_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestAgentCertificateConfinedToItsNode: node agent A, with the client
// certificate kairon-local gives it, tries to write node B's Node, a
// Machine on B and a migration between B and C, each refused by the API
// server; the same writes to its own objects succeed.
func TestAgentCertificateConfinedToItsNode(t *testing.T) {
	cp := controlPlane(t)
	ctx := context.Background()
	adm := admin(t, cp)
	a, b, c := "cert-a", "cert-b", "cert-c"
	nodeA, nodeB := makeNode(t, adm, a), makeNode(t, adm, b)
	makeNode(t, adm, c)
	agentA := agent(t, cp, a)

	t.Run("nodes", func(t *testing.T) {
		label := func(k, v string) map[string]any {
			return map[string]any{"metadata": map[string]any{"labels": map[string]any{k: v}}}
		}
		refused(t, "label node B", mergePatch(ctx, agentA, nodeB, label(kaironv1.LabelNodeBackend, "qemu"), false), "may not write Node "+b)
		refused(t, "status of node B", mergePatch(ctx, agentA, nodeB, map[string]any{"status": map[string]any{
			"addresses": []map[string]any{{"type": "InternalIP", "address": "10.9.9.9"}}}}, true), "may not write Node "+b)
		refused(t, "create node C2", agentA.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cert-c2"}}), "may not write Node cert-c2")
		refused(t, "migration endpoint on its own node", mergePatch(ctx, agentA, nodeA, map[string]any{"metadata": map[string]any{
			"annotations": map[string]any{kaironv1.AnnotationNodeMigrationEndpoint: "10.1.2.3:10251"}}}, false), "kairon-controller owns it")
		refused(t, "a label the agent does not keep", mergePatch(ctx, agentA, nodeA, label("tier", "trusted"), false), "may set only the Node labels")
		refused(t, "uncordon itself", mergePatch(ctx, agentA, nodeA, map[string]any{"spec": map[string]any{"unschedulable": true}}, false), "may not change the spec of its Node")

		allowed(t, "label its own node", mergePatch(ctx, agentA, nodeA, label(kaironv1.LabelNodeBackend, "qemu"), false))
		allowed(t, "migration port on its own node", mergePatch(ctx, agentA, nodeA, map[string]any{"metadata": map[string]any{
			"annotations": map[string]any{kaironv1.AnnotationNodeMigrationPort: "10251"}}}, false))
		allowed(t, "status of its own node", mergePatch(ctx, agentA, nodeA, map[string]any{"status": map[string]any{
			"addresses": []map[string]any{{"type": "InternalIP", "address": "127.0.0.1"}}}}, true))
		// Registering: an agent creates its own Node when there is none.
		own := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cert-r", Labels: map[string]string{kaironv1.LabelNode: "true"}}}
		allowed(t, "register its own node", agent(t, cp, "cert-r").Create(ctx, own))
		t.Cleanup(func() { _ = adm.Delete(context.Background(), own) })
	})

	t.Run("machines", func(t *testing.T) {
		ns := makeNamespace(t, adm)
		onA, onB := makeMachine(t, adm, ns, "on-a", a), makeMachine(t, adm, ns, "on-b", b)
		unplaced := makeMachine(t, adm, ns, "unplaced", "")
		finalizer := map[string]any{"metadata": map[string]any{"finalizers": []string{kaironv1.FinalizerMachineVM}}}
		phase := map[string]any{"status": map[string]any{"phase": kaironv1.MachineRunning}}

		refused(t, "finalizer on a Machine on node B", mergePatch(ctx, agentA, onB, finalizer, false), "may not write Machine on-b on node "+b)
		refused(t, "status of a Machine on node B", mergePatch(ctx, agentA, onB, phase, true), "may not write Machine on-b on node "+b)
		refused(t, "take an unplaced Machine", mergePatch(ctx, agentA, unplaced, map[string]any{"spec": map[string]any{"nodeName": a}}, false), "which is on no node")
		refused(t, "push its Machine to node B", mergePatch(ctx, agentA, onA, map[string]any{"spec": map[string]any{"nodeName": b}}, false), "only to "+a)
		refused(t, "change the image of its Machine", mergePatch(ctx, agentA, onA, map[string]any{"spec": map[string]any{"image": "other"}}, false), "may change nothing in the spec")
		// Naming a Secret there would make kairon-controller grant the
		// agent read access to it (internal/controller/node_pull_secrets.go).
		refused(t, "name a pull secret on its Machine", mergePatch(ctx, agentA, onA, map[string]any{"spec": map[string]any{
			"imagePullSecrets": []map[string]any{{"name": "someone-elses"}}}}, false), "may change nothing in the spec")
		refused(t, "start its stopped Machine", mergePatch(ctx, agentA, onA, map[string]any{"spec": map[string]any{"powerState": "Stopped"}}, false), "may change nothing in the spec")
		refused(t, "relabel its Machine", mergePatch(ctx, agentA, onA, map[string]any{"metadata": map[string]any{"labels": map[string]any{kaironv1.LabelMachineClaim: "x"}}}, false), "may change no labels")
		refused(t, "create a Machine", agentA.Create(ctx, &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "new"}, Spec: kaironv1.MachineSpec{Image: "default"}}), "cannot create resource")
		refused(t, "delete a Machine on node B", agentA.Delete(ctx, onB), "cannot delete resource")

		allowed(t, "finalizer on its Machine", mergePatch(ctx, agentA, onA, finalizer, false))
		allowed(t, "status of its Machine", mergePatch(ctx, agentA, onA, phase, true))
		allowed(t, "drop its finalizer", mergePatch(ctx, agentA, onA, map[string]any{"metadata": map[string]any{"finalizers": nil}}, false))
		// The migration switch: the target moves spec.nodeName from the
		// source to itself, only once kairon-controller named it the
		// migration's target on the Machine. An agent cannot name itself.
		toA := map[string]any{"spec": map[string]any{"nodeName": a}}
		nameTarget := func(node string) {
			t.Helper()
			if err := mergePatch(ctx, adm, onB, map[string]any{"metadata": map[string]any{
				"annotations": map[string]any{kaironv1.AnnotationMachineMigrationTarget: node}}}, false); err != nil {
				t.Fatalf("naming %s the target as kairon-controller would: %v", node, err)
			}
		}
		refused(t, "pull a Machine on node B no migration moves", mergePatch(ctx, agentA, onB, toA, false), "named it the target of a running migration")
		refused(t, "name itself the target of a Machine on node B", mergePatch(ctx, agentA, onB, map[string]any{"metadata": map[string]any{
			"annotations": map[string]any{kaironv1.AnnotationMachineMigrationTarget: a}}}, false), "may not write Machine on-b on node "+b)
		nameTarget(c)
		refused(t, "pull a Machine on node B that migrates to node C", mergePatch(ctx, agentA, onB, toA, false), "named it the target of a running migration")
		nameTarget(a)
		allowed(t, "switch a Machine from node B to itself as its migration's target", mergePatch(ctx, agentA, onB, toA, false))
	})

	t.Run("migrations", func(t *testing.T) {
		ns := makeNamespace(t, adm)
		makeMachine(t, adm, ns, "m", b)
		betweenBC := makeMigration(t, adm, ns, "b-to-c", "m", b, c)
		fromA := makeMigration(t, adm, ns, "a-to-b", "m", a, b)
		toA := makeMigration(t, adm, ns, "c-to-a", "m", c, a)
		saved := map[string]any{"metadata": map[string]any{
			"finalizers":  []string{kaironv1.FinalizerMigrationSource},
			"annotations": map[string]any{kaironv1.AnnotationMigrationStateSaved: "true"},
		}}
		failed := map[string]any{"status": map[string]any{"phase": kaironv1.MigrationFailed, "reason": "SaveFailed"}}

		refused(t, "annotate a migration from B to C", mergePatch(ctx, agentA, betweenBC, saved, false), "may not write MachineMigration b-to-c")
		refused(t, "fail a migration from B to C", mergePatch(ctx, agentA, betweenBC, failed, true), "may not write MachineMigration b-to-c")
		refused(t, "redirect its migration to itself", mergePatch(ctx, agentA, fromA, map[string]any{"status": map[string]any{"targetNode": a}}, true), "may not change the nodes")
		refused(t, "redirect a migration to it elsewhere", mergePatch(ctx, agentA, toA, map[string]any{"status": map[string]any{"sourceNode": b}}, true), "may not change the nodes")
		refused(t, "succeed its migration", mergePatch(ctx, agentA, fromA, map[string]any{"status": map[string]any{"phase": kaironv1.MigrationSucceeded}}, true), "phase only to Failed")
		refused(t, "hand over as the target", mergePatch(ctx, agentA, toA, saved, false), "as its source node, the finalizer")
		token := map[string]any{"metadata": map[string]any{"annotations": map[string]any{"kairon.zyvor.dev/transfer-token-sha256": "ab12"}}}
		refused(t, "publish a transfer token for a migration from B to C", mergePatch(ctx, agentA, betweenBC, token, false), "may not write MachineMigration b-to-c")
		refused(t, "label its migration", mergePatch(ctx, agentA, toA, map[string]any{"metadata": map[string]any{"labels": map[string]any{"x": "y"}}}, false), "only the annotation")
		refused(t, "create a migration", agentA.Create(ctx, &kaironv1.MachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "new"}, Spec: kaironv1.MachineMigrationSpec{MachineName: "m"}}), "cannot create resource")

		allowed(t, "hold and hand over as the source", mergePatch(ctx, agentA, fromA, saved, false))
		allowed(t, "release as the source", mergePatch(ctx, agentA, fromA, map[string]any{"metadata": map[string]any{"finalizers": nil}}, false))
		allowed(t, "publish a transfer token as the target", mergePatch(ctx, agentA, toA, token, false))
		allowed(t, "consume a transfer token as the source", mergePatch(ctx, agentA, fromA, token, false))
		allowed(t, "fail as the target", mergePatch(ctx, agentA, toA, failed, true))
	})

	// Each agent reports its own enforcement of a network policy; a claim
	// binds on its node's report, so another node's entry is not its to
	// write.
	t.Run("network policies", func(t *testing.T) {
		ns := makeNamespace(t, adm)
		p := &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "egress"}, Spec: kaironv1.MachineNetworkPolicySpec{MachineName: "vm-b"}}
		if err := adm.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		entry := func(node string, machines ...string) map[string]any {
			return map[string]any{"node": node, "machines": machines, "observedGeneration": 1}
		}
		nodes := func(entries ...map[string]any) map[string]any {
			return map[string]any{"status": map[string]any{"nodes": entries}}
		}
		if err := mergePatch(ctx, adm, p, nodes(entry(b, "vm-b")), true); err != nil {
			t.Fatalf("node B's report, as its agent would write it: %v", err)
		}
		// The policy is the last one made; the API server takes it in a
		// moment after the others.
		testenv.Eventually(t, time.Minute, "reporting node B's Machines as confined to be refused", func() (bool, string) {
			err := mergePatch(ctx, agentA, p, nodes(entry(b, "vm-b", "vm-x")), true)
			return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "only its own entry of status.nodes"), fmt.Sprint(err)
		})
		refused(t, "drop node B's report", mergePatch(ctx, agentA, p, nodes(entry(a, "vm-a")), true), "only its own entry of status.nodes")
		refused(t, "set the MACHINES count to anything but the entries' sum", mergePatch(ctx, agentA, p, map[string]any{"status": map[string]any{"machines": 9}}, true),
			"only to the number of Machines its status.nodes entries list")
		refused(t, "set the observed generation", mergePatch(ctx, agentA, p, map[string]any{"status": map[string]any{"observedGeneration": 7}}, true),
			"may write only status.nodes and status.machines")
		allowed(t, "add its own report", mergePatch(ctx, agentA, p, nodes(entry(b, "vm-b"), entry(a, "vm-a")), true))
		// The count with the report, as the agent writes it: only the
		// true sum of every node's entries.
		withCount := func(count int, entries ...map[string]any) map[string]any {
			body := nodes(entries...)
			body["status"].(map[string]any)["machines"] = count
			return body
		}
		refused(t, "count only its own Machines", mergePatch(ctx, agentA, p, withCount(2, entry(b, "vm-b"), entry(a, "vm-a", "vm-a3")), true),
			"only to the number of Machines its status.nodes entries list")
		allowed(t, "change its report with the entries' count", mergePatch(ctx, agentA, p, withCount(3, entry(b, "vm-b"), entry(a, "vm-a", "vm-a3")), true))
		fresh := &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fresh"}, Spec: kaironv1.MachineNetworkPolicySpec{MachineName: "vm-a"}}
		if err := adm.Create(ctx, fresh); err != nil {
			t.Fatal(err)
		}
		allowed(t, "the first report on a policy without a status", mergePatch(ctx, agentA, fresh, nodes(entry(a, "vm-a")), true))
		allowed(t, "change its own report", mergePatch(ctx, agentA, p, nodes(entry(b, "vm-b"), entry(a, "vm-a", "vm-a2")), true))
	})
}
