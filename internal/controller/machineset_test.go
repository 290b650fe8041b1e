package controller

import (
	"context"
	"regexp"
	"sort"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

func createMachineSet(t *testing.T, env *testenv.Env, ns, name string, replicas int32) *kaironv1.MachineSet {
	t.Helper()
	set := &kaironv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: kaironv1.MachineSetSpec{
			Replicas: ptr.To(replicas),
			Selector: kaironv1.MachineSelector{MatchLabels: map[string]string{"app": name}},
			Template: kaironv1.MachineTemplateSpec{
				Metadata: kaironv1.MachineTemplateMeta{
					Labels:      map[string]string{"app": name, "tier": "front"},
					Annotations: map[string]string{"example.com/note": "from the template"},
				},
				Spec: kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("256Mi")},
			},
		},
	}
	if err := env.Client.Create(context.Background(), set); err != nil {
		t.Fatalf("creating machine set: %v", err)
	}
	return set
}

// liveMachineNames are the set's Machines that are not being deleted, sorted.
func liveMachineNames(t *testing.T, env *testenv.Env, ns, set string) []string {
	t.Helper()
	var names []string
	for _, m := range listMachines(t, env, ns, client.MatchingLabels{kaironv1.LabelMachineSet: set}) {
		if m.DeletionTimestamp == nil {
			names = append(names, m.Name)
		}
	}
	sort.Strings(names)
	return names
}

func waitMachineSet(t *testing.T, env *testenv.Env, ns, name string, replicas, ready int32) {
	t.Helper()
	eventually(t, "machine set status", func() (bool, string) {
		var set kaironv1.MachineSet
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &set); err != nil {
			return false, err.Error()
		}
		ok := set.Status.Replicas == replicas && set.Status.ReadyReplicas == ready &&
			set.Status.ObservedGeneration == set.Generation && set.Status.Selector == "app="+name &&
			len(liveMachineNames(t, env, ns, name)) == int(replicas)
		return ok, fmtJSON(set.Status) + " machines " + strings.Join(liveMachineNames(t, env, ns, name), ",")
	})
}

// Scaling with kubectl through the scale subresource creates Machines from
// the template and, scaling down, deletes those furthest from Running first.
func TestMachineSetScale(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	startControllers(t, env, ns, Options{})
	set := createMachineSet(t, env, ns, "web", 3)
	waitMachineSet(t, env, ns, "web", 3, 0)
	// Zero counts are written too, so kubectl prints 0, not a blank.
	if out := env.Kubectl(t, "-n", ns, "get", "machineset", "web", "-o", "jsonpath={.status.readyReplicas}"); out != "0" {
		t.Errorf("status.readyReplicas printed as %q, want 0", out)
	}

	nameFormat := regexp.MustCompile(`^web-[a-z0-9]{5}$`)
	for _, m := range listMachines(t, env, ns) {
		ref := metav1.GetControllerOf(&m)
		if !nameFormat.MatchString(m.Name) || m.Labels["app"] != "web" || m.Labels["tier"] != "front" ||
			m.Labels[kaironv1.LabelMachineSet] != "web" || m.Annotations["example.com/note"] != "from the template" ||
			ref == nil || ref.UID != set.UID || !ptr.Deref(ref.BlockOwnerDeletion, false) || m.Spec.CPU != 1 {
			t.Errorf("machine not built from the template: %s labels %v annotations %v owner %+v", m.Name, m.Labels, m.Annotations, ref)
		}
	}

	env.Kubectl(t, "-n", ns, "scale", "machineset", "web", "--replicas", "5")
	waitMachineSet(t, env, ns, "web", 5, 0)

	// There are no nodes, so everything is Pending; play the node agent for
	// three of them.
	names := liveMachineNames(t, env, ns, "web")
	running := names[:2]
	booting := names[2]
	for _, name := range running {
		m := getMachine(t, env, ns, name)
		patch := client.MergeFrom(m.DeepCopy())
		m.Spec.NodeName = "elsewhere"
		if err := env.Client.Patch(context.Background(), m, patch); err != nil {
			t.Fatal(err)
		}
		setMachinePhase(t, env, m, kaironv1.MachineRunning)
	}
	m := getMachine(t, env, ns, booting)
	patch := client.MergeFrom(m.DeepCopy())
	m.Spec.NodeName = "elsewhere"
	if err := env.Client.Patch(context.Background(), m, patch); err != nil {
		t.Fatal(err)
	}
	setMachinePhase(t, env, m, kaironv1.MachineBooting)
	waitMachineSet(t, env, ns, "web", 5, 2)

	env.Kubectl(t, "-n", ns, "scale", "machineset", "web", "--replicas", "3")
	waitMachineSet(t, env, ns, "web", 3, 2)
	if got, want := liveMachineNames(t, env, ns, "web"), []string{running[0], running[1], booting}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("after scaling to 3 kept %v, want the Running and Booting ones %v", got, want)
	}

	env.Kubectl(t, "-n", ns, "scale", "machineset", "web", "--replicas", "2")
	waitMachineSet(t, env, ns, "web", 2, 2)
	if got := liveMachineNames(t, env, ns, "web"); strings.Join(got, ",") != strings.Join(running, ",") {
		t.Errorf("after scaling to 2 kept %v, want the Running ones %v", got, running)
	}

	out := env.Kubectl(t, "-n", ns, "get", "machineset", "web", "-o", "jsonpath={.status.replicas}/{.status.readyReplicas}")
	if out != "2/2" {
		t.Errorf("kubectl get: replicas/ready %q, want 2/2", out)
	}
}

// An orphan the selector matches is adopted instead of creating a new
// Machine; one that stops matching is released.
func TestMachineSetAdoptsAndReleases(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createMachine(t, env, ns, "orphan", 1, "256Mi", func(m *kaironv1.Machine) { m.Labels = map[string]string{"app": "db"} })
	startControllers(t, env, ns, Options{})
	set := createMachineSet(t, env, ns, "db", 1)

	eventually(t, "the orphan to be adopted", func() (bool, string) {
		m := getMachine(t, env, ns, "orphan")
		ref := metav1.GetControllerOf(m)
		all := listMachines(t, env, ns)
		return ref != nil && ref.UID == set.UID && len(all) == 1, fmtJSON(m.OwnerReferences)
	})

	m := getMachine(t, env, ns, "orphan")
	patch := client.MergeFrom(m.DeepCopy())
	m.Labels["app"] = "something-else"
	if err := env.Client.Patch(context.Background(), m, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the relabelled Machine released and replaced", func() (bool, string) {
		m := getMachine(t, env, ns, "orphan")
		replacements := liveMachineNames(t, env, ns, "db")
		return metav1.GetControllerOf(m) == nil && len(replacements) == 1, fmtJSON(m.OwnerReferences) + " " + strings.Join(replacements, ",")
	})
}

// Deleting a set deletes its Machines through kube-controller-manager's
// garbage collector, which follows the controller ownerReference.
func TestMachineSetDeletionCollectsMachines(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	startControllers(t, env, ns, Options{})
	set := createMachineSet(t, env, ns, "batch", 2)
	waitMachineSet(t, env, ns, "batch", 2, 0)

	if err := env.Client.Delete(context.Background(), set, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the garbage collector to delete the Machines", func() (bool, string) {
		left := listMachines(t, env, ns)
		var names []string
		for _, m := range left {
			names = append(names, m.Name)
		}
		return len(left) == 0, strings.Join(names, ",")
	})
	err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(set), &kaironv1.MachineSet{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("machine set still there: %v", err)
	}
}
