package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

func TestKubectlScaleUsesTheScaleSubresource(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()

	pool := object(t, "kind: MachinePool\nmetadata: {name: agents}\nspec: {replicas: 1}")
	pool.SetNamespace(ns)
	set := object(t, "kind: MachineSet\nmetadata: {name: web}\nspec: {replicas: 1, selector: {matchLabels: {app: web}}, template: {metadata: {labels: {app: web}}}}")
	set.SetNamespace(ns)
	for _, obj := range []*unstructured.Unstructured{pool, set} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}

	env.Kubectl(t, "-n", ns, "scale", "machinepool", "agents", "--replicas", "3")
	env.Kubectl(t, "-n", ns, "scale", "machineset", "web", "--replicas", "5")

	pools := &kaironv1.MachinePool{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "agents"}, pools); err != nil {
		t.Fatal(err)
	}
	sets := &kaironv1.MachineSet{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, sets); err != nil {
		t.Fatal(err)
	}
	if got := *pools.Spec.Replicas; got != 3 {
		t.Errorf("machinepool agents spec.replicas = %d after kubectl scale, want 3", got)
	}
	if got := *sets.Spec.Replicas; got != 5 {
		t.Errorf("machineset web spec.replicas = %d after kubectl scale, want 5", got)
	}

	// The scale subresource reports the selector the HPA needs.
	out := env.Kubectl(t, "-n", ns, "get", "--raw",
		fmt.Sprintf("/apis/kairon.zyvor.dev/v1alpha1/namespaces/%s/machinepools/agents/scale", ns))
	if !strings.Contains(out, `"kind":"Scale"`) || !strings.Contains(out, `"replicas":3`) {
		t.Errorf("scale subresource of machinepool: %s", out)
	}
}

// A HorizontalPodAutoscaler in the real kube-controller-manager drives a
// MachinePool through /scale. Below minReplicas the HPA scales up without
// needing any metric, which makes the effect observable here.
func TestHorizontalPodAutoscalerScalesAMachinePool(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()

	pool := &kaironv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hpa-agents"},
		Spec:       kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](1)},
	}
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// Stand in for the pool controller, which owns status.
	pool.Status.Replicas = 1
	pool.Status.Selector = kaironv1.LabelMachinePool + "=hpa-agents," + kaironv1.LabelPoolState + "=" + kaironv1.PoolStateWarm
	if err := env.Client.Status().Update(ctx, pool); err != nil {
		t.Fatal(err)
	}

	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agents"},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{
				APIVersion: kaironv1.GroupVersion.String(), Kind: "MachinePool", Name: "hpa-agents",
			},
			MinReplicas: ptr.To[int32](4),
			MaxReplicas: 6,
		},
	}
	if err := env.Client.Create(ctx, hpa); err != nil {
		t.Fatal(err)
	}

	testenv.Eventually(t, 90*time.Second, "the HPA to scale the pool to minReplicas 4", func() (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
			return false, err.Error()
		}
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(hpa), hpa)
		return *pool.Spec.Replicas == 4, fmt.Sprintf("spec.replicas=%d, HPA status %+v", *pool.Spec.Replicas, hpa.Status)
	})
}

// An HPA drives a MachineSet the same way, through /scale: above
// maxReplicas it scales down, below minReplicas up, and its status reports
// the replicas the set's status gives.
func TestHorizontalPodAutoscalerScalesAMachineSet(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()

	set := &kaironv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hpa-web"},
		Spec: kaironv1.MachineSetSpec{
			Replicas: ptr.To[int32](8),
			Selector: kaironv1.MachineSelector{MatchLabels: map[string]string{"app": "hpa-web"}},
			Template: kaironv1.MachineTemplateSpec{Metadata: kaironv1.MachineTemplateMeta{Labels: map[string]string{"app": "hpa-web"}}},
		},
	}
	if err := env.Client.Create(ctx, set); err != nil {
		t.Fatal(err)
	}
	// Stand in for the set controller, which owns status.
	set.Status.Replicas = 8
	set.Status.Selector = "app=hpa-web"
	if err := env.Client.Status().Update(ctx, set); err != nil {
		t.Fatal(err)
	}
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{
				APIVersion: kaironv1.GroupVersion.String(), Kind: "MachineSet", Name: "hpa-web",
			},
			MinReplicas: ptr.To[int32](2),
			MaxReplicas: 5,
		},
	}
	if err := env.Client.Create(ctx, hpa); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "the HPA to scale the set down to maxReplicas 5", func() (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(set), set); err != nil {
			return false, err.Error()
		}
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(hpa), hpa)
		return *set.Spec.Replicas == 5 && hpa.Status.CurrentReplicas == 8,
			fmt.Sprintf("spec.replicas=%d, HPA status %+v", *set.Spec.Replicas, hpa.Status)
	})

	// Below minReplicas it scales up.
	set.Status.Replicas = 1
	if err := env.Client.Status().Update(ctx, set); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(set), set); err != nil {
		t.Fatal(err)
	}
	base := set.DeepCopy()
	set.Spec.Replicas = ptr.To[int32](1)
	if err := env.Client.Patch(ctx, set, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "the HPA to scale the set up to minReplicas 2", func() (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(set), set); err != nil {
			return false, err.Error()
		}
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(hpa), hpa)
		return *set.Spec.Replicas == 2, fmt.Sprintf("spec.replicas=%d, HPA status %+v", *set.Spec.Replicas, hpa.Status)
	})
}

// KEDA scales its targets through the same /scale subresource (a
// ScaledObject may name any kind that has one). A patch of the scale
// subresource, as KEDA's scale client sends, sets spec.replicas of a
// MachineSet and a MachinePool and nothing else; the Scale read back
// carries the status selector KEDA hands to the HPA it manages.
func TestScaleSubresourcePatchAsKEDASendsIt(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()

	pool := object(t, "kind: MachinePool\nmetadata: {name: keda-agents}\nspec: {replicas: 1}")
	pool.SetNamespace(ns)
	set := object(t, "kind: MachineSet\nmetadata: {name: keda-web}\nspec: {replicas: 1, selector: {matchLabels: {app: keda-web}}, template: {metadata: {labels: {app: keda-web}}}}")
	set.SetNamespace(ns)
	for _, obj := range []*unstructured.Unstructured{pool, set} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ resource, name string }{{"machinepools", "keda-agents"}, {"machinesets", "keda-web"}} {
		env.Kubectl(t, "-n", ns, "patch", c.resource, c.name, "--subresource=scale", "--type=merge", "-p", `{"spec":{"replicas":7}}`)
		out := env.Kubectl(t, "-n", ns, "get", "--raw",
			fmt.Sprintf("/apis/kairon.zyvor.dev/v1alpha1/namespaces/%s/%s/%s/scale", ns, c.resource, c.name))
		if !strings.Contains(out, `"kind":"Scale"`) || !strings.Contains(out, `"spec":{"replicas":7}`) {
			t.Errorf("%s %s scale after the patch: %s", c.resource, c.name, out)
		}
	}
	var p kaironv1.MachinePool
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "keda-agents"}, &p); err != nil {
		t.Fatal(err)
	}
	var s kaironv1.MachineSet
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "keda-web"}, &s); err != nil {
		t.Fatal(err)
	}
	if *p.Spec.Replicas != 7 || *s.Spec.Replicas != 7 || s.Spec.Selector.MatchLabels["app"] != "keda-web" {
		t.Errorf("after the scale patches: pool spec %+v, set spec %+v", p.Spec, s.Spec)
	}
}

func TestKubectlGetBudgetsShowsTheBudgetColumns(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	mdb := object(t, "kind: MachineDisruptionBudget\nmetadata: {name: web-tier}\nspec: {selector: {tier: web}, minAvailable: \"2\"}")
	mdb.SetNamespace(ns)
	if err := env.Client.Create(context.Background(), mdb); err != nil {
		t.Fatal(err)
	}
	out := env.Kubectl(t, "-n", ns, "get", "mdb")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get mdb printed %d lines, want header + 1:\n%s", len(lines), out)
	}
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "NAME MINAVAILABLE MAXUNAVAILABLE EXPECTED HEALTHY DESIRED ALLOWED" {
		t.Errorf("kubectl get mdb header = %q", lines[0])
	}
	if got := strings.Fields(lines[1]); got[0] != "web-tier" || got[1] != "2" {
		t.Errorf("kubectl get mdb row = %q", lines[1])
	}
}
