package kaironctl_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

func restartedAt(t *testing.T, env *testenv.Env, ns, name string) string {
	t.Helper()
	p := &kaironv1.MachinePool{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, p); err != nil {
		t.Fatal(err)
	}
	return p.Spec.Template.Metadata.Annotations[kaironv1.AnnotationRestartedAt]
}

// rollout restart stamps the pool's template with the time, a new value
// each time (so each restart is a new template for the pool controller),
// keeping the template's other annotations; -o prints the pool as stored.
func TestRolloutRestart(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	for _, name := range []string{"agents", "builders"} {
		env.Create(t, &kaironv1.MachinePool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](0), Template: kaironv1.MachineTemplateSpec{
				Metadata: kaironv1.MachineTemplateMeta{Annotations: map[string]string{"team": "ml"}},
			}},
		})
	}

	before := time.Now().UTC().Truncate(time.Second)
	r := kctl(t, env, "-n", ns, "rollout", "restart", "machinepool", "agents").ok(t)
	if r.stdout != "machinepool/agents restarted\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	first := restartedAt(t, env, ns, "agents")
	at, err := time.Parse(time.RFC3339, first)
	if err != nil || at.Before(before) || at.After(time.Now().Add(time.Minute)) {
		t.Errorf("%s = %q (%v), want the time of the restart", kaironv1.AnnotationRestartedAt, first, err)
	}

	// Within the same second, too, a second restart is a new template.
	r = kctl(t, env, "-n", ns, "rollout", "restart", "mp/agents", "-o", "json").ok(t)
	var printed kaironv1.MachinePool
	if err := json.Unmarshal([]byte(r.stdout), &printed); err != nil {
		t.Fatalf("-o json: %v\n%s", err, r.stdout)
	}
	second := restartedAt(t, env, ns, "agents")
	if second == first || printed.Spec.Template.Metadata.Annotations[kaironv1.AnnotationRestartedAt] != second ||
		printed.Spec.Template.Metadata.Annotations["team"] != "ml" || printed.Kind != "MachinePool" {
		t.Errorf("second restart: stored %q (first %q), printed %v kind %q", second, first, printed.Spec.Template.Metadata.Annotations, printed.Kind)
	}

	r = kctl(t, env, "-n", ns, "rollout", "restart", "machinepool", "agents", "builders", "-o", "yaml").ok(t)
	var list struct {
		Kind  string                 `json:"kind"`
		Items []kaironv1.MachinePool `json:"items"`
	}
	if err := yaml.Unmarshal([]byte(r.stdout), &list); err != nil || list.Kind != "List" || len(list.Items) != 2 ||
		list.Items[1].Name != "builders" || list.Items[1].Spec.Template.Metadata.Annotations[kaironv1.AnnotationRestartedAt] == "" {
		t.Errorf("-o yaml of two pools: %v\n%s", err, r.stdout)
	}

	// One pool missing: the others are restarted, and the error names it.
	r = kctl(t, env, "-n", ns, "rollout", "restart", "machinepool", "nope", "builders")
	r.failed(t, `machinepool "nope" not found in namespace "`+ns+`"`)
	if r.stdout != "machinepool/builders restarted\n" {
		t.Errorf("stdout with one pool missing: %q", r.stdout)
	}
}

func TestRolloutRestartMistakes(t *testing.T) {
	env := testenv.Get(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"rollout"}, "rollout needs a command: restart"},
		{[]string{"rollout", "undo", "mp/agents"}, `unknown rollout command "undo"; rollout has: restart`},
		{[]string{"rollout", "restart"}, "rollout restart needs a KIND (machinepool) and a NAME"},
		{[]string{"rollout", "restart", "machinepool"}, "rollout restart machinepool needs a NAME"},
		{[]string{"rollout", "restart", "machineset", "web"}, "machinesets cannot be restarted; rollout restart works on machinepools"},
		{[]string{"rollout", "restart", "mp/a", "ms/b"}, "rollout restart works on one kind at a time"},
		{[]string{"rollout", "restart", "mp", "a", "-o", "wide"}, `unknown output format "wide"`},
		{[]string{"rollout", "restart", "gizmo", "a"}, `gizmo`},
	} {
		kctl(t, env, tc.args...).failed(t, tc.want)
	}
	if !strings.Contains(kctl(t, env, "--help").ok(t).stdout, "rollout") {
		t.Error("kaironctl --help does not list rollout")
	}
}
