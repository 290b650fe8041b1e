package confinement_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/controlplane"
)

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = kaironv1.AddToScheme(s)
	return s
}()

func newClient(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func admin(t *testing.T, cp *controlplane.ControlPlane) client.Client {
	return newClient(t, cp.RESTConfig())
}

func fromKubeconfig(t *testing.T, file string) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", file)
	if err != nil {
		t.Fatal(err)
	}
	return newClient(t, cfg)
}

// agent is node agent name's client, with the certificate kairon-local
// gives it.
func agent(t *testing.T, cp *controlplane.ControlPlane, name string) client.Client {
	t.Helper()
	file, err := cp.NodeKubeconfig(name)
	if err != nil {
		t.Fatal(err)
	}
	return fromKubeconfig(t, file)
}

// mergePatch sends body (a JSON merge patch) to obj, or to its status.
func mergePatch(ctx context.Context, c client.Client, obj client.Object, body map[string]any, status bool) error {
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	p := client.RawPatch(types.MergePatchType, data)
	if status {
		return c.Status().Patch(ctx, obj, p)
	}
	return c.Patch(ctx, obj, p)
}

// dryPatch is mergePatch as a dry run, on a copy of obj: admission
// decides as for the real write, and nothing is written.
func dryPatch(ctx context.Context, c client.Client, obj client.Object, body map[string]any, status bool) error {
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	p := client.RawPatch(types.MergePatchType, data)
	cp := obj.DeepCopyObject().(client.Object)
	if status {
		return c.Status().Patch(ctx, cp, p, client.DryRunAll)
	}
	return c.Patch(ctx, cp, p, client.DryRunAll)
}

// refused fails t unless err is the API server's 403 saying want.
func refused(t *testing.T, what string, err error, want string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: allowed, want refused (%q)", what, want)
	case !apierrors.IsForbidden(err):
		t.Errorf("%s: %v, want 403 Forbidden (%q)", what, err, want)
	case !strings.Contains(err.Error(), want):
		t.Errorf("%s: refused with %q, want %q", what, err.Error(), want)
	}
}

func allowed(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v, want allowed", what, err)
	}
}

func makeNode(t *testing.T, c client.Client, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kaironv1.LabelNode: "true"}}}
	if err := c.Create(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), n) })
	return n
}

func makeNamespace(t *testing.T, c client.Client) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "confinement-"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), ns) })
	return ns.Name
}

func makeMachine(t *testing.T, c client.Client, ns, name, node string) *kaironv1.Machine {
	t.Helper()
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kaironv1.MachineSpec{NodeName: node, Image: "default"}}
	if err := c.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return m
}

// makeMigration creates a migration of machine whose status says it moves
// from source to target, as the controller writes it.
func makeMigration(t *testing.T, c client.Client, ns, name, machine, source, target string) *kaironv1.MachineMigration {
	t.Helper()
	ctx := context.Background()
	mig := &kaironv1.MachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kaironv1.MachineMigrationSpec{MachineName: machine, TargetNode: target}}
	if err := c.Create(ctx, mig); err != nil {
		t.Fatal(err)
	}
	if err := mergePatch(ctx, c, mig, map[string]any{"status": map[string]any{
		"phase": kaironv1.MigrationRunning, "sourceNode": source, "targetNode": target,
	}}, true); err != nil {
		t.Fatal(err)
	}
	return mig
}
