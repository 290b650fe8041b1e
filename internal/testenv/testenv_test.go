package testenv_test

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

func TestEnvHasKaironCRDsAndATypedClient(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "machinepools.kairon.zyvor.dev"}, crd); err != nil {
		t.Fatalf("MachinePool CRD: %v", err)
	}
	ns := env.Namespace(t)
	pools := &kaironv1.MachinePoolList{}
	if err := env.Client.List(ctx, pools, client.InNamespace(ns)); err != nil {
		t.Fatalf("listing MachinePools with the typed client: %v", err)
	}
	if env.Kubeconfig == "" || env.BinDir == "" {
		t.Errorf("Env lacks Kubeconfig or BinDir: %+v", env)
	}
}

// The garbage collector runs only in kube-controller-manager, so a deleted
// owner taking its dependent along shows the controller manager is working.
func TestControllerManagerCollectsGarbage(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()

	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: ns}}
	if err := env.Client.Create(ctx, owner); err != nil {
		t.Fatal(err)
	}
	dependent := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: "dependent", Namespace: ns,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}},
	}}
	if err := env.Client.Create(ctx, dependent); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, owner); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(dependent), &corev1.ConfigMap{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatal("dependent ConfigMap still there a minute after its owner was deleted: is kube-controller-manager running?")
	}
}

func TestNamespaceIsFreshPerCall(t *testing.T) {
	env := testenv.Get(t)
	a, b := env.Namespace(t), env.Namespace(t)
	if a == b {
		t.Fatalf("two calls gave the same namespace %s", a)
	}
	got := &corev1.Namespace{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: a}, got); err != nil {
		t.Fatal(err)
	}
	if want := "t-testnamespaceisfreshpercall-"; len(a) <= len(want) || a[:len(want)] != want {
		t.Errorf("namespace %q does not start with %q", a, want)
	}
}
