package controller

import (
	"context"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// The API server asks the Machine webhook only about the writes it judges.
// Pointed at a port nobody serves, under failurePolicy Fail, every write
// the API server sends it fails; the others go through.
func TestMachineWebhookMatchConditions(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	node := createNode(t, env, ns, "a", 16, "16Gi")
	m := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m"},
		Spec:       kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("64Mi")},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	_, caPEM := writeServingCert(t)
	dead := webhookServer{port: freePort(t), caPEM: caPEM}
	dead.register(t, env, ns, MachineWebhookPath,
		[]admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, "machines")

	update := func(what string, change func(*kaironv1.Machine), wantCalled bool) {
		t.Helper()
		// The webhook configuration reaches the API server's admission
		// through a watch: wait until a write it must judge fails, then
		// check this one.
		testenv.Eventually(t, waitTimeout, "the webhook configuration in force", func() (bool, string) {
			probe := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"},
				Spec: kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("64Mi")}}
			err := env.Client.Create(ctx, probe, client.DryRunAll)
			return err != nil && strings.Contains(err.Error(), "failed calling webhook"), "a create still admitted"
		})
		cur := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), cur); err != nil {
			t.Fatal(err)
		}
		changed := cur.DeepCopy()
		change(changed)
		err := env.Client.Patch(ctx, changed, client.MergeFrom(cur))
		called := err != nil && strings.Contains(err.Error(), "failed calling webhook")
		if err != nil && !called {
			t.Fatalf("%s: %v", what, err)
		}
		if called != wantCalled {
			t.Errorf("%s: sent to the webhook %v, want %v (err %v)", what, called, wantCalled, err)
		}
	}
	update("labelling it for a claim", func(m *kaironv1.Machine) {
		m.Labels = map[string]string{kaironv1.LabelMachineClaim: "c", "app": "x"}
	}, false)
	update("adding a finalizer", func(m *kaironv1.Machine) { m.Finalizers = append(m.Finalizers, "example.com/keep") }, false)
	update("stopping it", func(m *kaironv1.Machine) { m.Spec.PowerState = kaironv1.PowerStateStopped }, false)
	update("starting it again", func(m *kaironv1.Machine) { m.Spec.PowerState = kaironv1.PowerStateRunning }, true)
	update("placing it", func(m *kaironv1.Machine) { m.Spec.NodeName = node.Name }, true)
	update("removing the finalizer", func(m *kaironv1.Machine) { m.Finalizers = nil }, false)
}
