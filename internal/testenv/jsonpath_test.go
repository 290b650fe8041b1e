package testenv_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// JSONPath prints what kubectl get -o jsonpath prints, for one object, a
// missing key, a list with a label or field selector, a cluster-scoped
// kind and the names kubectl accepts for a kind; and fails as kubectl
// does on an object that is not there.
func TestJSONPathPrintsWhatKubectlPrints(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	for _, name := range []string{"a", "b"} {
		m := &kaironv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "web-" + name}},
			Spec:       kaironv1.MachineSpec{CPU: 2, Memory: resource.MustParse("256Mi")},
		}
		if err := env.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: "a.1"},
		InvolvedObject: corev1.ObjectReference{Kind: "Machine", Name: "a", Namespace: ns},
		Reason:         "Tested", Message: "hello from the test", Type: corev1.EventTypeNormal,
	}
	if err := env.Client.Create(ctx, ev); err != nil {
		t.Fatal(err)
	}

	kubectl := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(filepath.Join(env.BinDir, "kubectl"), append([]string{"--kubeconfig", env.Kubeconfig}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	for _, c := range []struct {
		get      testenv.Query
		template string
		kubectl  []string
	}{
		{testenv.Query{Namespace: ns, Resource: "machine", Name: "a"}, "{.spec.cpu} {.metadata.labels.app} {.spec.memory}",
			[]string{"-n", ns, "get", "machine", "a"}},
		{testenv.Query{Namespace: ns, Resource: "machines", Name: "a"}, "{.metadata.name}|{.status.nodeName}|{.spec.noSuchField}",
			[]string{"-n", ns, "get", "machines", "a"}},
		{testenv.Query{Namespace: ns, Resource: "Machine", LabelSelector: "app=web-b"}, "{.items[*].metadata.name}",
			[]string{"-n", ns, "get", "Machine", "-l", "app=web-b"}},
		{testenv.Query{Namespace: ns, Resource: "machines"}, `{range .items[*]}{.metadata.name}={.spec.cpu}{"\n"}{end}`,
			[]string{"-n", ns, "get", "machines"}},
		{testenv.Query{Namespace: ns, Resource: "events", FieldSelector: "involvedObject.kind=Machine,involvedObject.name=a,reason=Tested"},
			`{range .items[*]}{.type}|{.message}{"\n"}{end}`,
			[]string{"-n", ns, "get", "events", "--field-selector", "involvedObject.kind=Machine,involvedObject.name=a,reason=Tested"}},
		{testenv.Query{Namespace: "ignored for a cluster-scoped kind", Resource: "namespace", Name: ns}, "{.metadata.name} {.status.phase}",
			[]string{"get", "namespace", ns}},
	} {
		want := kubectl(append(c.kubectl, "-o", "jsonpath="+c.template)...)
		got, err := testenv.JSONPath(env.Kubeconfig, c.get, c.template)
		if err != nil {
			t.Errorf("%+v: %v", c.get, err)
			continue
		}
		if got != want {
			t.Errorf("%+v %s: got %q, kubectl printed %q", c.get, c.template, got, want)
		}
		if got == "" {
			t.Errorf("%+v %s: printed nothing; the case shows nothing", c.get, c.template)
		}
	}

	if _, err := testenv.JSONPath(env.Kubeconfig, testenv.Query{Namespace: ns, Resource: "machine", Name: "nope"}, "{.metadata.name}"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("a Machine that is not there: %v, want not found", err)
	}
	if _, err := testenv.JSONPath(env.Kubeconfig, testenv.Query{Resource: "nosuchkinds", Name: "x"}, "{.metadata.name}"); err == nil || !strings.Contains(err.Error(), `"nosuchkinds"`) {
		t.Errorf("an unknown resource: %v, want an error naming it", err)
	}
}
