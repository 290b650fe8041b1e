package chart

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/controller"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

func TestMain(m *testing.M) {
	// The node agent logs through controller-runtime's global logger.
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.WarnLevel)))
	// helm installs the CRDs from charts/kairon/crds (TestInstall checks
	// that it does), so the control plane starts without them.
	os.Exit(testenv.RunWithoutCRDs(m))
}

// installTimeout bounds every wait in TestInstall; a loaded two-core
// machine is slow, but not this slow.
const installTimeout = 90 * time.Second

// installRelease is the release TestInstall installs; its fullname is
// "kairon", so objects are kairon-controller and kairon-node.
const installRelease = "kairon"

// TestInstall installs the chart with bin/helm into a real API server (the
// CRDs from charts/kairon/crds included) and checks what it created. Then it
// runs kairon-controller's controllers and a sim-backed kairon-node with the
// service-account tokens of the chart's ServiceAccounts, so with exactly the
// chart's RBAC and nothing else, drives a MachineSet, a MachinePool with
// claims, a MachineQuota and a MachineDisruptionBudget through them, and
// fails on any request the API server forbade. It upgrades the release to
// cordon evacuation and the webhooks and runs cordon evacuation the same
// way, and finally uninstalls the release.
func TestInstall(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()

	// The control plane starts without the chart's CRDs (RunWithoutCRDs),
	// so that this test sees helm install them from charts/kairon/crds.
	// Run after TestInstallUI (-shuffle, -count), it finds those that
	// test's helm left and deletes them first.
	crdNames := chartCRDNames(t)
	deleteCRDs(t, env, crdNames)

	kube := []string{"--kubeconfig", env.Kubeconfig, "--namespace", ns}
	values := []string{"controller.replicas=2"}
	mustHelm(t, append(append([]string{"install", installRelease, chartDir(t), "--timeout", "2m"}, setArgs(values)...), kube...)...)
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			_, _, _ = runHelm(t, append([]string{"uninstall", installRelease}, kube...)...)
		}
	})

	// CRDs: all of them back, from the chart, established and in the API
	// server's discovery. Established comes first: a client that looks a
	// kind up between the two (env.Client below) is told it does not exist.
	disco, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range crdNames {
		var crd apiextensionsv1.CustomResourceDefinition
		eventually(t, "CRD "+name+" established and served", func() (bool, string) {
			if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
				return false, err.Error()
			}
			if !slices.ContainsFunc(crd.Status.Conditions, func(c apiextensionsv1.CustomResourceDefinitionCondition) bool {
				return c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
			}) {
				return false, fmt.Sprintf("conditions %+v", crd.Status.Conditions)
			}
			gv := crd.Spec.Group + "/" + crd.Spec.Versions[0].Name
			list, err := disco.ServerResourcesForGroupVersion(gv)
			if err != nil {
				return false, fmt.Sprintf("discovery of %s: %v", gv, err)
			}
			served := slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == crd.Spec.Names.Plural })
			return served, fmt.Sprintf("%s not in the discovery of %s yet", crd.Spec.Names.Plural, gv)
		})
	}
	// The chart's MutatingAdmissionPolicy on MachineClaims needs the
	// re-created CRD's schema, which the API server reads from its own
	// OpenAPI every 5 s; until then it answers a claim create with 503
	// "Resource kind ... MachineClaim not found. There can be a delay ..."
	// (whatever the policy's failurePolicy). A dry run goes through
	// admission and writes nothing; the policy is in force, schema and
	// all, once the claim it returns has the finalizer the policy adds.
	eventually(t, "the claim finalizer policy to admit a MachineClaim", func() (bool, string) {
		probe := &kaironv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "admission-probe"},
			Spec:       kaironv1.MachineClaimSpec{PoolName: "none"},
		}
		if err := env.Client.Create(ctx, probe, client.DryRunAll); err != nil {
			return false, err.Error()
		}
		return slices.Contains(probe.Finalizers, kaironv1.FinalizerMachineClaim), fmt.Sprintf("dry-run claim has finalizers %v", probe.Finalizers)
	})

	controllerSA, nodeSA := installRelease+"-controller", installRelease+"-node"
	var dep appsv1.Deployment
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: controllerSA}, &dep); err != nil {
		t.Fatalf("controller Deployment: %v", err)
	}
	args := dep.Spec.Template.Spec.Containers[0].Args
	for _, want := range []string{"-interval=5s", "-leader-elect", "-leader-election-namespace=" + ns} {
		if !slices.Contains(args, want) {
			t.Errorf("installed controller args %q lack %s", args, want)
		}
	}
	var ds appsv1.DaemonSet
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: nodeSA}, &ds); err != nil {
		t.Fatalf("node agent DaemonSet: %v", err)
	}

	// The ClusterRoles on the server are what `helm template` renders.
	rendered := render(t, setArgs(values)...)
	for _, name := range []string{controllerSA, nodeSA} {
		var want, got rbacv1.ClusterRole
		// kairon-controller here is kt-kairon-controller in render's output.
		get(t, rendered, "ClusterRole", testRelease+"-kairon"+strings.TrimPrefix(name, installRelease), &want)
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &got); err != nil {
			t.Fatalf("ClusterRole %s: %v", name, err)
		}
		if !reflect.DeepEqual(got.Rules, want.Rules) {
			t.Errorf("ClusterRole %s on the server has rules\n%+v\nwant\n%+v", name, got.Rules, want.Rules)
		}
		if verbs := verbsOn(got.Rules, kaironGroup, "machinemigrations"); slices.Contains(verbs, "create") {
			t.Errorf("ClusterRole %s may create machinemigrations by default: %v", name, verbs)
		}
	}
	var leaseRole rbacv1.Role
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: controllerSA + "-leader-election"}, &leaseRole); err != nil {
		t.Fatalf("leader election Role: %v", err)
	}

	t.Run("RBAC is enough", func(t *testing.T) {
		runWithChartRBAC(t, env, ns, controllerSA, nodeSA)
	})

	// Cordon evacuation needs `create` on machinemigrations, which only
	// controller.cordonEvacuation.enabled grants: upgrade to it and run it.
	// The same upgrade turns the webhooks on, for namespaces with a label
	// none has: the API server must accept the configuration, but nothing
	// here serves it.
	caPEM := testCAPEM(t)
	values = append(values, "controller.cordonEvacuation.enabled=true",
		"webhook.enabled=true", "webhook.tlsSecretName=kairon-webhook-tls",
		`webhook.namespaceSelector.matchLabels.kairon\.zyvor\.dev/chart-test=nowhere`)
	upgrade := append([]string{"upgrade", installRelease, chartDir(t), "--timeout", "2m"}, setArgs(values)...)
	upgrade = append(upgrade, "--set-string", "webhook.caBundle="+base64.StdEncoding.EncodeToString(caPEM))
	mustHelm(t, append(upgrade, kube...)...)
	var role rbacv1.ClusterRole
	if err := env.Client.Get(ctx, client.ObjectKey{Name: controllerSA}, &role); err != nil {
		t.Fatal(err)
	}
	if !allows(role.Rules, kaironGroup, "machinemigrations", "create") {
		t.Errorf("after the upgrade to cordon evacuation the controller may not create machinemigrations; its verbs there: %v",
			verbsOn(role.Rules, kaironGroup, "machinemigrations"))
	}
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := env.Client.Get(ctx, client.ObjectKey{Name: installRelease + "-machines"}, &vwc); err != nil {
		t.Fatalf("ValidatingWebhookConfiguration after the upgrade: %v", err)
	}
	var hooks []string
	for _, w := range vwc.Webhooks {
		hooks = append(hooks, w.Name)
		if !bytes.Equal(bytes.TrimSpace(w.ClientConfig.CABundle), bytes.TrimSpace(caPEM)) {
			t.Errorf("webhook %s on the server has caBundle\n%s\nwant\n%s", w.Name, w.ClientConfig.CABundle, caPEM)
		}
		if svc := w.ClientConfig.Service; svc == nil || svc.Namespace != ns || svc.Name != controllerSA {
			t.Errorf("webhook %s on the server calls %+v, want Service %s/%s", w.Name, svc, ns, controllerSA)
		}
	}
	if want := []string{"machines.kairon.zyvor.dev", "machinemigrations.kairon.zyvor.dev"}; !slices.Equal(hooks, want) {
		t.Errorf("webhooks on the server %v, want %v", hooks, want)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: controllerSA}, &dep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-cordon-evacuate", "-webhook"} {
		if args := dep.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, want) {
			t.Errorf("upgraded controller args %q lack %s", args, want)
		}
	}
	t.Run("cordon evacuation RBAC is enough", func(t *testing.T) {
		runCordonEvacuation(t, env, ns, controllerSA)
	})

	mustHelm(t, append([]string{"uninstall", installRelease}, kube...)...)
	uninstalled = true
	eventually(t, "the release's objects to go", func() (bool, string) {
		var left []string
		for _, obj := range []client.Object{
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: controllerSA}},
			&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: nodeSA}},
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: controllerSA}},
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: nodeSA}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: controllerSA}},
			&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: installRelease + "-machines"}},
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: controllerSA}},
		} {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); !apierrors.IsNotFound(err) {
				left = append(left, fmt.Sprintf("%T %s (%v)", obj, obj.GetName(), err))
			}
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
	// Helm never deletes the CRDs of crds/, so uninstalling keeps every
	// Machine in the cluster.
	for _, name := range crdNames {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &apiextensionsv1.CustomResourceDefinition{}); err != nil {
			t.Errorf("CRD %s after uninstall: %v", name, err)
		}
	}
}

// runWithChartRBAC runs the controllers and a node agent as the chart's
// ServiceAccounts and drives every controller once.
func runWithChartRBAC(t *testing.T, env *testenv.Env, ns, controllerSA, nodeSA string) {
	ctx := context.Background()
	// A Node like a kubelet's: the agent (no --register) only labels it.
	nodeName := createNode(t, env, "chart-"+ns, nil)
	controllerCfg, controllerDenied := serviceAccountConfig(t, env, ns, controllerSA)
	// The agent's token names its node, as the DaemonSet Pod's does: the
	// node confinement policies refuse an agent whose token names none.
	nodeCfg, nodeDenied := serviceAccountConfig(t, env, ns, nodeSA, agentPod(t, env, ns, nodeSA, nodeName))
	// Registered first, so it runs last, after both stopped, and also when
	// a wait below failed (often because of one of these).
	t.Cleanup(func() {
		for who, denied := range map[string]*deniedRequests{controllerSA: controllerDenied, nodeSA: nodeDenied} {
			if got := denied.list(); len(got) > 0 {
				t.Errorf("the API server refused %s (the chart's RBAC lacks these):\n  %s", who, strings.Join(got, "\n  "))
			}
		}
	})

	// Booking pods, on by default in the chart, so their RBAC is checked too.
	startControllers(t, env, controllerCfg, ns, controller.Options{Interval: 2 * time.Second, CapacityBooking: controller.CapacityBookingOptions{Enabled: true}})
	startNodeAgent(t, nodeCfg, nodeName)

	eventually(t, "the agent to label its Node", func() (bool, string) {
		var n corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: nodeName}, &n); err != nil {
			return false, err.Error()
		}
		return n.Labels[kaironv1.LabelNode] == "true", fmt.Sprintf("labels %v", n.Labels)
	})

	selector := map[string]string{"app": "chart-test"}
	set := &kaironv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: kaironv1.MachineSetSpec{
			Replicas: ptr.To[int32](2),
			Selector: kaironv1.MachineSelector{MatchLabels: selector},
			Template: kaironv1.MachineTemplateSpec{
				Metadata: kaironv1.MachineTemplateMeta{Labels: selector},
				Spec:     kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("64Mi")},
			},
		},
	}
	quota := &kaironv1.MachineQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"},
		Spec:       kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{Machines: ptr.To[int32](10)}},
	}
	budget := &kaironv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec:       kaironv1.MachineDisruptionBudgetSpec{Selector: selector, MinAvailable: ptr.To(intstr.FromInt32(1))},
	}
	for _, obj := range []client.Object{quota, budget, set} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T: %v", obj, err)
		}
	}

	eventually(t, "the MachineSet's Machines to run on the agent's node", func() (bool, string) {
		var list kaironv1.MachineList
		if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		var saw []string
		running := 0
		for _, m := range list.Items {
			saw = append(saw, fmt.Sprintf("%s node=%q phase=%s finalizers=%v", m.Name, m.Spec.NodeName, m.Status.Phase, m.Finalizers))
			if m.Spec.NodeName == nodeName && m.Status.Phase == kaironv1.MachineRunning && slices.Contains(m.Finalizers, kaironv1.FinalizerMachineVM) {
				running++
			}
		}
		return running == 2 && len(list.Items) == 2, strings.Join(saw, "; ")
	})
	eventually(t, "a booking pod per Machine", func() (bool, string) {
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(ns), client.HasLabels{rules.LabelCapacityBooking}); err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 2, fmt.Sprintf("%d booking pods", len(pods.Items))
	})
	eventually(t, "the statuses of the MachineSet, quota and budget", func() (bool, string) {
		var s kaironv1.MachineSet
		var q kaironv1.MachineQuota
		var b kaironv1.MachineDisruptionBudget
		for _, obj := range []client.Object{&s, &q, &b} {
			key := client.ObjectKey{Namespace: ns, Name: "web"}
			if _, isQuota := obj.(*kaironv1.MachineQuota); isQuota {
				key.Name = "team"
			}
			if err := env.Client.Get(ctx, key, obj); err != nil {
				return false, err.Error()
			}
		}
		used := int32(-1)
		if q.Status.Used.Machines != nil {
			used = *q.Status.Used.Machines
		}
		saw := fmt.Sprintf("set ready %d, quota machines used %d, budget %+v", s.Status.ReadyReplicas, used, b.Status)
		return s.Status.ReadyReplicas == 2 && used == 2 &&
			b.Status.ExpectedMachines == 2 && b.Status.CurrentHealthy == 2 && b.Status.DisruptionsAllowed == 1, saw
	})

	var lease coordinationv1.Lease
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: leaderElectionID}, &lease); err != nil {
		t.Errorf("leader election lease in %s: %v", ns, err)
	} else if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Errorf("leader election lease has no holder: %+v", lease.Spec)
	}

	pool := runPoolAndClaims(t, env, ns)

	// Scaling down makes the controller delete Machines and the agent stop
	// them and release its finalizer.
	patch := client.MergeFrom(set.DeepCopy())
	set.Spec.Replicas = ptr.To[int32](0)
	if err := env.Client.Patch(ctx, set, patch); err != nil {
		t.Fatal(err)
	}
	patch = client.MergeFrom(pool.DeepCopy())
	pool.Spec.Replicas = ptr.To[int32](0)
	if err := env.Client.Patch(ctx, pool, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Machines to be deleted", func() (bool, string) {
		var list kaironv1.MachineList
		if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		var saw []string
		for _, m := range list.Items {
			saw = append(saw, fmt.Sprintf("%s phase=%s deleting=%v finalizers=%v", m.Name, m.Status.Phase, m.DeletionTimestamp != nil, m.Finalizers))
		}
		return len(list.Items) == 0, strings.Join(saw, "; ")
	})

}

// runPoolAndClaims drives the warm-pool controllers: a MachinePool of two,
// a claim with an egress allowlist (so a MachineNetworkPolicy) that the test
// releases by deleting it, and a claim that expires, which the controller
// deletes itself. It returns the pool.
func runPoolAndClaims(t *testing.T, env *testenv.Env, ns string) *kaironv1.MachinePool {
	t.Helper()
	ctx := context.Background()
	pool := &kaironv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agents"},
		Spec: kaironv1.MachinePoolSpec{
			Replicas: ptr.To[int32](2),
			Template: kaironv1.MachineTemplateSpec{
				Metadata: kaironv1.MachineTemplateMeta{Labels: map[string]string{"app": "agent"}},
				Spec:     kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("64Mi")},
			},
		},
	}
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pool to be warm", func() (bool, string) {
		var p kaironv1.MachinePool
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pool), &p); err != nil {
			return false, err.Error()
		}
		return p.Status.ReadyWarm == 2, fmt.Sprintf("status %+v", p.Status)
	})

	withEgress := &kaironv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "with-egress"},
		Spec: kaironv1.MachineClaimSpec{
			PoolName: pool.Name,
			Labels:   map[string]string{"team": "ml"},
			Egress:   &kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8"}, AllowPorts: []kaironv1.PortRange{"443"}},
		},
	}
	if err := env.Client.Create(ctx, withEgress); err != nil {
		t.Fatal(err)
	}
	var policy string
	eventually(t, "the claim to bind with its egress policy", func() (bool, string) {
		var c kaironv1.MachineClaim
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(withEgress), &c); err != nil {
			return false, err.Error()
		}
		policy = c.Status.EgressPolicy
		if c.Status.Phase != kaironv1.ClaimBound || policy == "" {
			return false, fmt.Sprintf("status %+v", c.Status)
		}
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: policy}, &kaironv1.MachineNetworkPolicy{})
		return err == nil, fmt.Sprintf("policy %s: %v", policy, err)
	})

	expiring := &kaironv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "expiring"},
		Spec:       kaironv1.MachineClaimSpec{PoolName: pool.Name, TTLSeconds: ptr.To[int64](1)},
	}
	if err := env.Client.Create(ctx, expiring); err != nil {
		t.Fatal(err)
	}
	// Only the controller deletes it: after it bound and its TTL ran out.
	waitGone(t, env, "the expiring claim", expiring)

	if err := env.Client.Delete(ctx, withEgress); err != nil {
		t.Fatal(err)
	}
	waitGone(t, env, "the released claim", withEgress)
	waitGone(t, env, "the released claim's egress policy",
		&kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: policy}})
	return pool
}

// waitGone waits until obj no longer exists.
func waitGone(t *testing.T, env *testenv.Env, what string, obj client.Object) {
	t.Helper()
	eventually(t, what+" to go", func() (bool, string) {
		err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)
		return apierrors.IsNotFound(err), fmt.Sprintf("get: %v; finalizers %v", err, obj.GetFinalizers())
	})
}

// createNode creates a ready Node with room for Machines, as a kubelet
// would, and deletes it when the test ends. It returns the Node's name.
func createNode(t *testing.T, env *testenv.Env, name string, labels map[string]string) string {
	t.Helper()
	ctx := context.Background()
	if len(name) > 63 {
		name = name[:63]
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := env.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
	allocatable := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("8Gi")}
	n.Status = corev1.NodeStatus{
		Capacity: allocatable, Allocatable: allocatable,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
	}
	if err := env.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	return name
}

// runCordonEvacuation runs the controllers with cordon evacuation as the
// chart's controller ServiceAccount, cordons a node with a running Machine
// and waits for the controller to create the Machine's migration and stamp
// its attempt.
func runCordonEvacuation(t *testing.T, env *testenv.Env, ns, controllerSA string) {
	ctx := context.Background()
	cfg, denied := serviceAccountConfig(t, env, ns, controllerSA)
	t.Cleanup(func() {
		if got := denied.list(); len(got) > 0 {
			t.Errorf("the API server refused %s (the chart's RBAC lacks these):\n  %s", controllerSA, strings.Join(got, "\n  "))
		}
	})
	kaironNode := map[string]string{kaironv1.LabelNode: "true"}
	source := createNode(t, env, "cordoned-"+ns, kaironNode)
	createNode(t, env, "target-"+ns, kaironNode)

	// The Machine is placed and Running, as scheduler and agent would leave it.
	m := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "evacuee"},
		Spec:       kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("64Mi"), NodeName: source},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	base := m.DeepCopy()
	m.Status.Phase = kaironv1.MachineRunning
	if err := env.Client.Status().Patch(ctx, m, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}

	startControllers(t, env, cfg, ns, controller.Options{
		Interval:               2 * time.Second,
		CordonEvacuate:         true,
		CordonEvacuateStrategy: controller.CordonEvacuateCold,
	})

	var n corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: source}, &n); err != nil {
		t.Fatal(err)
	}
	cordon := client.MergeFrom(n.DeepCopy())
	n.Spec.Unschedulable = true
	if err := env.Client.Patch(ctx, &n, cordon); err != nil {
		t.Fatal(err)
	}

	eventually(t, "the evacuee's migration and attempt stamp", func() (bool, string) {
		var migs kaironv1.MachineMigrationList
		if err := env.Client.List(ctx, &migs, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		var cur kaironv1.Machine
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), &cur); err != nil {
			return false, err.Error()
		}
		found := slices.ContainsFunc(migs.Items, func(mig kaironv1.MachineMigration) bool {
			return mig.Spec.MachineName == m.Name && mig.Spec.Strategy == kaironv1.MigrationCold
		})
		stamp := cur.Annotations[kaironv1.AnnotationCordonEvacuateAttemptedAt]
		return found && stamp != "", fmt.Sprintf("%d migrations %+v; attempt stamp %q", len(migs.Items), migs.Items, stamp)
	})
}

// leaderElectionID is kairon-controller's lease name (cmd/kairon-controller).
const leaderElectionID = "kairon-controller.kairon.zyvor.dev"

// startControllers runs every Kairon controller the way kairon-controller
// does with -leader-elect, cluster-wide, until the test ends.
func startControllers(t *testing.T, env *testenv.Env, cfg *rest.Config, ns string, opts controller.Options) {
	t.Helper()
	env.StartManager(t, cfg, ctrl.Options{
		LeaderElection:                true,
		LeaderElectionID:              leaderElectionID,
		LeaderElectionNamespace:       ns,
		LeaderElectionReleaseOnCancel: true,
		Controller:                    config.Controller{SkipNameValidation: ptr.To(true)},
	}, func(mgr ctrl.Manager) error { return controller.SetupWithManager(mgr, opts) })
}

// startNodeAgent runs a sim-backed kairon-node for nodeName, as the chart
// runs it: no --register, a network range, no console server.
func startNodeAgent(t *testing.T, cfg *rest.Config, nodeName string) {
	t.Helper()
	stateDir := t.TempDir()
	backend, err := sim.New(sim.Options{StateDir: filepath.Join(stateDir, "instances"), BootDelay: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := node.New(cfg, node.Options{
		NodeName: nodeName, Backend: backend, StateDir: stateDir,
		Network:  &node.NetworkOptions{CIDR: netip.MustParsePrefix("10.88.0.0/24"), NoLinks: true},
		Interval: time.Second,
	})
	if err != nil {
		t.Fatalf("creating the node agent: %v", err)
	}
	testenv.RunInBackground(t, "node agent", agent.Run)
}

// serviceAccountConfig is a client config that authenticates with a fresh
// token of ServiceAccount ns/name, as a pod running under it would, and
// records every request the API server refuses with 403. With bound, the
// token is bound to that object (a Pod: the API server then puts the Pod's
// node in the token).
func serviceAccountConfig(t *testing.T, env *testenv.Env, ns, name string, bound ...*authenticationv1.BoundObjectReference) (*rest.Config, *deniedRequests) {
	t.Helper()
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if len(bound) > 0 {
		tr.Spec.BoundObjectRef = bound[0]
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := env.Client.SubResource("token").Create(context.Background(), sa, tr); err != nil {
		t.Fatalf("token for ServiceAccount %s/%s: %v", ns, name, err)
	}
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tr.Status.Token
	cfg.QPS, cfg.Burst = 200, 400
	denied := &deniedRequests{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if err == nil && resp.StatusCode == http.StatusForbidden {
				denied.add(req.Method + " " + req.URL.RequestURI())
			}
			return resp, err
		})
	})
	return cfg, denied
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// deniedRequests collects the requests the API server refused.
type deniedRequests struct {
	mu   sync.Mutex
	seen []string
}

func (d *deniedRequests) add(s string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !slices.Contains(d.seen, s) {
		d.seen = append(d.seen, s)
	}
}

func (d *deniedRequests) list() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.seen)
}

// chartCRDNames are the names of the CRDs in charts/kairon/crds.
func chartCRDNames(t *testing.T) []string {
	t.Helper()
	var names []string
	for file, data := range readYAMLDir(t, filepath.Join(chartDir(t), "crds")) {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(data, &crd); err != nil || crd.Name == "" {
			t.Fatalf("charts/kairon/crds/%s: not a CRD (%v)", file, err)
		}
		names = append(names, crd.Name)
	}
	slices.Sort(names)
	return names
}

// eventually waits, up to installTimeout, for check to report done.
func eventually(t *testing.T, what string, check func() (done bool, saw string)) {
	t.Helper()
	testenv.Eventually(t, installTimeout, what, check)
}

// deleteCRDs deletes those of names that exist and waits until all are
// gone; with none there it returns after one look.
func deleteCRDs(t *testing.T, env *testenv.Env, names []string) {
	t.Helper()
	ctx := context.Background()
	for _, name := range names {
		err := env.Client.Delete(ctx, &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: name}})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("deleting CRD %s: %v", name, err)
		}
	}
	// The API server deletes every object of a CRD before the CRD goes;
	// on a loaded machine that outlasted installTimeout once.
	testenv.Eventually(t, 5*time.Minute, "the CRDs an earlier helm install left to go", func() (bool, string) {
		var left []string
		for _, name := range names {
			err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &apiextensionsv1.CustomResourceDefinition{})
			if !apierrors.IsNotFound(err) {
				left = append(left, name)
			}
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
}
