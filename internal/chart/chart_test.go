// Package chart tests the Helm chart in charts/kairon with the pinned
// bin/helm: lint, what `helm template` renders for each value that matters,
// the alerts file, and an install into a real API server where the
// controller and a node agent run with nothing but the chart's RBAC.
package chart

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/zyvor/kairon/internal/controller"
	"github.com/zyvor/kairon/internal/testenv/host"
)

var (
	controllerName = testRelease + "-kairon-controller"
	nodeAgentName  = testRelease + "-kairon-node"
)

// The directory the chart mounts the webhook Secret at, passed as -webhook-cert-dir.
const webhookCertDir = "/etc/kairon/webhook-certs"

func TestCRDsMatchGenerated(t *testing.T) {
	root := repoRoot(t)
	generated := readYAMLDir(t, filepath.Join(root, "config", "crd", "bases"))
	inChart := readYAMLDir(t, filepath.Join(root, "charts", "kairon", "crds"))
	const fix = "charts/kairon/crds must hold exactly the CRDs of config/crd/bases: " +
		"run `rm -f charts/kairon/crds/*.yaml && cp config/crd/bases/*.yaml charts/kairon/crds/` " +
		"after `make generate`"
	if len(generated) == 0 {
		t.Fatal("config/crd/bases holds no CRDs")
	}
	for name, want := range generated {
		got, ok := inChart[name]
		switch {
		case !ok:
			t.Errorf("charts/kairon/crds/%s is missing; %s", name, fix)
		case !bytes.Equal(got, want):
			t.Errorf("charts/kairon/crds/%s differs from config/crd/bases/%s; %s", name, name, fix)
		}
	}
	for name := range inChart {
		if _, ok := generated[name]; !ok {
			t.Errorf("charts/kairon/crds/%s is not in config/crd/bases; %s", name, fix)
		}
	}
}

func readYAMLDir(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(p)] = data
	}
	return files
}

func TestLint(t *testing.T) {
	ca := base64.StdEncoding.EncodeToString(testCAPEM(t))
	for name, flags := range map[string][]string{
		"defaults": nil,
		"everything on": append(setArgs([]string{
			"controller.replicas=3",
			"controller.cordonEvacuation.enabled=true",
			"controller.cordonEvacuation.strategy=auto",
			"webhook.enabled=true",
			"webhook.tlsSecretName=kairon-webhook-tls",
			"migration.tlsSecretName=kairon-migration-tls",
			"node.acceleration=kvm",
			"metrics.serviceMonitor.enabled=true",
			"alerts.enabled=true",
		}), "--set-string", "webhook.caBundle="+ca),
		"no node agent": setArgs([]string{"node.enabled=false"}),
		"kairon-ui":     setArgs([]string{"ui.enabled=true", "ui.allowWrite=true"}),
	} {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"lint", "--strict", chartDir(t), "--namespace", testNamespace}, flags...)
			out := mustHelm(t, args...)
			if !strings.Contains(out, "0 chart(s) failed") {
				t.Errorf("helm lint:\n%s", out)
			}
		})
	}
}

func TestTemplateDefaults(t *testing.T) {
	m := render(t)

	want := []string{
		"ClusterRole/" + testRelease + "-kairon-console-reader",
		"ClusterRole/" + testRelease + "-kairon-guest-user",
		"ClusterRole/" + controllerName,
		"ClusterRole/" + controllerName + "-metrics-auth",
		"ClusterRole/" + testRelease + "-kairon-metrics-reader",
		"ClusterRole/" + nodeAgentName,
		"ClusterRoleBinding/" + testRelease + "-kairon-console-reader",
		"ClusterRoleBinding/" + controllerName,
		"ClusterRoleBinding/" + controllerName + "-metrics-auth",
		"ClusterRoleBinding/" + nodeAgentName,
		"DaemonSet/" + nodeAgentName,
		"Deployment/" + controllerName,
		"PriorityClass/kairon-capacity-booking",
		"Service/" + controllerName,
		"ServiceAccount/" + controllerName,
		"ServiceAccount/" + nodeAgentName,
	}
	// The admission policies (confinement_test.go checks their content).
	for _, p := range []string{"machine-placement", "node-confinement-machines", "node-confinement-migrations", "node-confinement-networkpolicies", "node-confinement-leases", "node-confinement-nodes", "node-confinement-snapshots", "claim-creation-stamp"} {
		want = append(want, "ValidatingAdmissionPolicy/"+testRelease+"-kairon-"+p, "ValidatingAdmissionPolicyBinding/"+testRelease+"-kairon-"+p)
	}
	slices.Sort(want)
	if got := m.keys(); !slices.Equal(got, want) {
		t.Errorf("rendered objects:\n got %v\nwant %v", got, want)
	}

	var dep appsv1.Deployment
	get(t, m, "Deployment", controllerName, &dep)
	if dep.Namespace != testNamespace {
		t.Errorf("Deployment namespace %q, want %q", dep.Namespace, testNamespace)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
		t.Errorf("replicas %v, want 1", dep.Spec.Replicas)
	}
	c := onlyContainer(t, dep.Spec.Template.Spec)
	wantArgs := []string{"-interval=5s", "-node-grace-period=40s", "-metrics-bind-address=:8443", "-metrics-secure", "-health-probe-bind-address=:8081",
		"-capacity-booking-pods", "-capacity-booking-image=registry.k8s.io/pause:3.10", "-capacity-booking-overhead=64Mi", "-capacity-booking-priority-class=kairon-capacity-booking"}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("controller args %q, want %q", c.Args, wantArgs)
	}
	if dep.Spec.Template.Spec.ServiceAccountName != controllerName {
		t.Errorf("controller service account %q, want %q", dep.Spec.Template.Spec.ServiceAccountName, controllerName)
	}
	if len(dep.Spec.Template.Spec.Volumes) != 0 || len(c.VolumeMounts) != 0 {
		t.Errorf("controller has volumes %v / mounts %v without the webhook", dep.Spec.Template.Spec.Volumes, c.VolumeMounts)
	}
	if sc := c.SecurityContext; sc == nil || sc.Privileged != nil && *sc.Privileged ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("controller container security context %+v: want unprivileged, no privilege escalation", sc)
	}

	var svc corev1.Service
	get(t, m, "Service", controllerName, &svc)
	ports := map[string]int32{}
	for _, p := range svc.Spec.Ports {
		ports[p.Name] = p.Port
	}
	if !reflect.DeepEqual(ports, map[string]int32{"metrics": 8443, "webhook": 9443}) {
		t.Errorf("Service ports %v, want metrics 8443 (secure serving) and webhook 9443", ports)
	}
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("Service selects %s=%s, which the controller pods do not carry", k, v)
		}
	}

	checkBinding(t, m, controllerName)
	checkBinding(t, m, nodeAgentName)
}

// onlyContainer is the pod's single container.
func onlyContainer(t *testing.T, spec corev1.PodSpec) corev1.Container {
	t.Helper()
	if len(spec.Containers) != 1 {
		t.Fatalf("pod has %d containers, want 1", len(spec.Containers))
	}
	return spec.Containers[0]
}

// checkBinding checks that ClusterRoleBinding name binds ClusterRole name to
// ServiceAccount name in the release namespace.
func checkBinding(t *testing.T, m manifests, name string) {
	t.Helper()
	var b rbacv1.ClusterRoleBinding
	get(t, m, "ClusterRoleBinding", name, &b)
	want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: testNamespace}}
	if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != name || !reflect.DeepEqual(b.Subjects, want) {
		t.Errorf("ClusterRoleBinding %s: roleRef %+v subjects %+v, want ClusterRole %s for %+v", name, b.RoleRef, b.Subjects, name, want)
	}
}

const kaironGroup = "kairon.zyvor.dev"

func TestControllerRBAC(t *testing.T) {
	var role rbacv1.ClusterRole
	get(t, render(t), "ClusterRole", controllerName, &role)
	checkNoWildcards(t, role.Rules)

	need := []struct {
		group, resource string
		verbs           []string
	}{
		{kaironGroup, "machines", []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{kaironGroup, "machines/status", []string{"patch"}},
		{kaironGroup, "machinesets", []string{"get", "list", "watch"}},
		{kaironGroup, "machinesets/status", []string{"patch"}},
		{kaironGroup, "machinepools", []string{"get", "list", "watch"}},
		{kaironGroup, "machinepools/status", []string{"patch"}},
		{kaironGroup, "machineclaims", []string{"get", "list", "watch", "patch", "delete"}},
		{kaironGroup, "machineclaims/status", []string{"patch"}},
		{kaironGroup, "machinequotas", []string{"get", "list", "watch"}},
		{kaironGroup, "machinequotas/status", []string{"patch"}},
		{kaironGroup, "machinedisruptionbudgets", []string{"get", "list", "watch"}},
		{kaironGroup, "machinedisruptionbudgets/status", []string{"patch"}},
		{kaironGroup, "machinenetworkpolicies", []string{"get", "list", "watch", "create", "patch", "delete"}},
		// patch: a fence releases the fenced source agent's finalizer.
		{kaironGroup, "machinemigrations", []string{"get", "list", "watch", "patch"}},
		{kaironGroup, "machinemigrations/status", []string{"patch"}},
		{kaironGroup, "migrationpolicies", []string{"get", "list", "watch"}},
		// SnapshotSchedules create and prune MachineSnapshots; the
		// snapshot controller labels and hands them out.
		{kaironGroup, "machinesnapshots", []string{"get", "list", "watch", "create", "patch", "delete"}},
		{kaironGroup, "machinesnapshots/status", []string{"patch"}},
		{kaironGroup, "snapshotschedules", []string{"get", "list", "watch"}},
		{kaironGroup, "snapshotschedules/status", []string{"patch"}},
		{"", "namespaces", []string{"get", "list", "watch"}},
		// patch: the controller owns the Nodes' migration-endpoint annotation.
		{"", "nodes", []string{"get", "list", "watch", "patch"}},
		// The scheduler counts the pods bound to a node; booking pods
		// (on by default) are created and deleted.
		{"", "pods", []string{"get", "list", "watch", "create", "delete"}},
		{kaironGroup, "machines", []string{"place"}},
		// Image pull secrets: a pool reads its template's by name; the
		// controller grants each node agent its Machines' ones, which
		// RBAC allows only to an identity holding get on them.
		{"", "secrets", []string{"get"}},
		// Node agents that share one ServiceAccount get their Machines'
		// pull secrets from the controller, which knows them by their
		// token (internal/controller/pull_credentials.go).
		{"authentication.k8s.io", "tokenreviews", []string{"create"}},
		{"rbac.authorization.k8s.io", "roles", []string{"get", "list", "watch", "create", "update", "delete"}},
		{"rbac.authorization.k8s.io", "rolebindings", []string{"get", "list", "watch", "create", "update", "delete"}},
		{"", "events", []string{"create", "patch"}},
		{"events.k8s.io", "events", []string{"create", "patch"}},
	}
	for _, n := range need {
		for _, verb := range n.verbs {
			if !allows(role.Rules, n.group, n.resource, verb) {
				t.Errorf("controller may not %s %s (group %q)", verb, n.resource, n.group)
			}
		}
	}

	// By default the controller never creates migrations: only
	// controller.cordonEvacuation.enabled grants that.
	if got, want := verbsOn(role.Rules, kaironGroup, "machinemigrations"), []string{"get", "list", "patch", "watch"}; !slices.Equal(got, want) {
		t.Errorf("controller verbs on machinemigrations %v, want %v", got, want)
	}
	refuse := []struct{ group, resource, verb string }{
		{kaironGroup, "machinemigrations", "create"},
		{kaironGroup, "machinemigrations", "delete"},
		{kaironGroup, "machinedisruptionbudgets", "update"},
		{kaironGroup, "machinequotas", "delete"},
		{kaironGroup, "migrationpolicies", "update"},
		{"", "namespaces", "update"},
		{"", "nodes", "update"},
		{"", "nodes", "delete"},
		// Secrets by name only: it cannot find one no Machine names.
		{"", "secrets", "list"},
		{"", "secrets", "watch"},
		{"rbac.authorization.k8s.io", "roles", "escalate"},
		{"rbac.authorization.k8s.io", "roles", "bind"},
		{"rbac.authorization.k8s.io", "clusterroles", "create"},
		{"rbac.authorization.k8s.io", "clusterrolebindings", "create"},
		{"", "pods", "update"},
		{"", "pods/exec", "create"},
		{"coordination.k8s.io", "leases", "create"},
	}
	for _, r := range refuse {
		if allows(role.Rules, r.group, r.resource, r.verb) {
			t.Errorf("controller may %s %s (group %q), which it does not need", r.verb, r.resource, r.group)
		}
	}
}

// Without booking pods the controller only reads pods, and no
// PriorityClass is made.
func TestTemplateCapacityBookingOff(t *testing.T) {
	m := render(t, "--set", "controller.capacityBooking.enabled=false")
	var role rbacv1.ClusterRole
	get(t, m, "ClusterRole", controllerName, &role)
	if got, want := verbsOn(role.Rules, "", "pods"), []string{"get", "list", "watch"}; !slices.Equal(got, want) {
		t.Errorf("controller verbs on pods %v, want %v", got, want)
	}
	for _, arg := range controllerArgs(t, m) {
		if strings.HasPrefix(arg, "-capacity-booking") {
			t.Errorf("booking off, but args have %s", arg)
		}
	}
	if m.has("PriorityClass", "kairon-capacity-booking") {
		t.Error("PriorityClass rendered with booking off")
	}
	named := controllerArgs(t, render(t, "--set", "controller.capacityBooking.priorityClass.create=false", "--set", "controller.capacityBooking.priorityClass.name=vm-critical"))
	if !slices.Contains(named, "-capacity-booking-priority-class=vm-critical") {
		t.Errorf("args %q lack the named priority class", named)
	}
}

func checkNoWildcards(t *testing.T, rules []rbacv1.PolicyRule) {
	t.Helper()
	for _, r := range rules {
		if slices.Contains(r.APIGroups, "*") || slices.Contains(r.Resources, "*") || slices.Contains(r.Verbs, "*") {
			t.Errorf("rule %+v uses a wildcard", r)
		}
	}
}

func TestNodeAgentRBAC(t *testing.T) {
	var role rbacv1.ClusterRole
	get(t, render(t), "ClusterRole", nodeAgentName, &role)
	checkNoWildcards(t, role.Rules)
	need := []struct {
		group, resource string
		verbs           []string
	}{
		{"", "nodes", []string{"get", "patch"}},
		{kaironGroup, "machines", []string{"get", "list", "watch", "patch", "place"}},
		{kaironGroup, "machines/status", []string{"patch"}},
		{kaironGroup, "machinemigrations", []string{"get", "list", "watch", "patch"}},
		{kaironGroup, "machinemigrations/status", []string{"patch"}},
		{kaironGroup, "machinesnapshots", []string{"get", "list", "watch"}},
		{kaironGroup, "machinesnapshots/status", []string{"patch"}},
		{"", "events", []string{"create", "patch"}},
		{"events.k8s.io", "events", []string{"create", "patch"}},
	}
	for _, n := range need {
		for _, verb := range n.verbs {
			if !allows(role.Rules, n.group, n.resource, verb) {
				t.Errorf("node agent may not %s %s (group %q)", verb, n.resource, n.group)
			}
		}
	}
	refuse := []struct{ group, resource, verb string }{
		{"", "nodes", "create"}, // the chart never passes --register
		{"", "nodes/status", "patch"},
		{"", "nodes", "delete"},
		{kaironGroup, "machines", "update"},
		{"", "nodes", "list"},
		{kaironGroup, "machines", "create"},
		{kaironGroup, "machines", "delete"},
		{kaironGroup, "machinemigrations", "create"},
		{kaironGroup, "machinemigrations", "delete"},
		{kaironGroup, "machinesnapshots", "create"},
		{kaironGroup, "machinesnapshots", "patch"},
		{kaironGroup, "machinesnapshots", "delete"},
		{"", "secrets", "get"},
	}
	for _, r := range refuse {
		if allows(role.Rules, r.group, r.resource, r.verb) {
			t.Errorf("node agent may %s %s (group %q), which it does not need", r.verb, r.resource, r.group)
		}
	}
}

func controllerArgs(t *testing.T, m manifests) []string {
	t.Helper()
	var dep appsv1.Deployment
	get(t, m, "Deployment", controllerName, &dep)
	return onlyContainer(t, dep.Spec.Template.Spec).Args
}

func TestTemplateControllerInterval(t *testing.T) {
	for _, interval := range []string{"1s", "30s", "2m"} {
		args := controllerArgs(t, render(t, "--set", "controller.interval="+interval))
		if !slices.Contains(args, "-interval="+interval) {
			t.Errorf("controller.interval=%s: args %q lack -interval=%s", interval, args, interval)
		}
	}
}

func TestTemplateLeaderElection(t *testing.T) {
	if args := controllerArgs(t, render(t)); slices.Contains(args, "-leader-elect") {
		t.Errorf("one replica runs with -leader-elect: %q", args)
	}
	m := render(t, "--set", "controller.replicas=2")
	var dep appsv1.Deployment
	get(t, m, "Deployment", controllerName, &dep)
	if *dep.Spec.Replicas != 2 {
		t.Errorf("replicas %d, want 2", *dep.Spec.Replicas)
	}
	args := onlyContainer(t, dep.Spec.Template.Spec).Args
	for _, want := range []string{"-leader-elect", "-leader-election-namespace=" + testNamespace} {
		if !slices.Contains(args, want) {
			t.Errorf("two replicas: args %q lack %s", args, want)
		}
	}
	lease := controllerName + "-leader-election"
	var role rbacv1.Role
	get(t, m, "Role", lease, &role)
	if role.Namespace != testNamespace {
		t.Errorf("lease Role in namespace %q, want %q", role.Namespace, testNamespace)
	}
	if got, want := verbsOn(role.Rules, "coordination.k8s.io", "leases"), []string{"create", "get", "update"}; !slices.Equal(got, want) {
		t.Errorf("lease verbs %v, want %v", got, want)
	}
	var binding rbacv1.RoleBinding
	get(t, m, "RoleBinding", lease, &binding)
	if binding.RoleRef.Name != lease || len(binding.Subjects) != 1 || binding.Subjects[0].Name != controllerName {
		t.Errorf("lease RoleBinding %+v does not bind %s to %s", binding, lease, controllerName)
	}
}

func TestTemplateCordonEvacuation(t *testing.T) {
	for _, arg := range controllerArgs(t, render(t)) {
		if strings.HasPrefix(arg, "-cordon-evacuate") {
			t.Errorf("cordon evacuation off, but args have %s", arg)
		}
	}

	for _, tc := range []struct {
		sets     []string
		wantArgs []string
	}{
		{
			sets:     []string{"controller.cordonEvacuation.enabled=true"},
			wantArgs: []string{"-cordon-evacuate", "-cordon-evacuate-strategy=cold", "-cordon-evacuate-min-retry-interval=2m"},
		},
		{
			sets: []string{
				"controller.cordonEvacuation.enabled=true",
				"controller.cordonEvacuation.strategy=auto",
				"controller.cordonEvacuation.minRetryInterval=5m30s",
			},
			wantArgs: []string{"-cordon-evacuate", "-cordon-evacuate-strategy=auto", "-cordon-evacuate-min-retry-interval=5m30s"},
		},
	} {
		m := render(t, setArgs(tc.sets)...)
		args := controllerArgs(t, m)
		for _, want := range tc.wantArgs {
			if !slices.Contains(args, want) {
				t.Errorf("%v: args %q lack %s", tc.sets, args, want)
			}
		}
		var role rbacv1.ClusterRole
		get(t, m, "ClusterRole", controllerName, &role)
		if got, want := verbsOn(role.Rules, kaironGroup, "machinemigrations"), []string{"create", "get", "list", "patch", "watch"}; !slices.Equal(got, want) {
			t.Errorf("%v: controller verbs on machinemigrations %v, want %v", tc.sets, got, want)
		}
		if allows(role.Rules, kaironGroup, "machinemigrations", "delete") || allows(role.Rules, kaironGroup, "machinemigrations", "update") {
			t.Errorf("%v: cordon evacuation grants more than create on machinemigrations", tc.sets)
		}
	}
}

// TestTemplateRefuses checks that values which cannot work stop the render
// with a message that says what to change.
func TestTemplateRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		want  []string
	}{
		{
			name:  "live cordon evacuation",
			flags: setArgs([]string{"controller.cordonEvacuation.enabled=true", "controller.cordonEvacuation.strategy=live"}),
			want:  []string{"controller.cordonEvacuation.strategy=live is not allowed", "cold or auto", "kaironctl evacuate"},
		},
		{
			name:  "live strategy while disabled",
			flags: setArgs([]string{"controller.cordonEvacuation.strategy=live"}),
			want:  []string{"controller.cordonEvacuation.strategy=live is not allowed"},
		},
		{
			name:  "unknown strategy",
			flags: setArgs([]string{"controller.cordonEvacuation.enabled=true", "controller.cordonEvacuation.strategy=warm"}),
			want:  []string{`controller.cordonEvacuation.strategy="warm" is not valid`, "cold or auto"},
		},
		{
			name:  "cross-node routing unknown",
			flags: setArgs([]string{"node.crossNode.clusterGuestCIDR=10.90.0.0/16", "node.crossNode.routing=bgp"}),
			want:  []string{`node.crossNode.routing="bgp" is not valid`, "host or vxlan"},
		},
		{
			name:  "webhook without TLS",
			flags: setArgs([]string{"webhook.enabled=true"}),
			want:  []string{"webhook.enabled=true needs webhook.tlsSecretName", "does not create a certificate"},
		},
		{
			name:  "webhook without caBundle",
			flags: setArgs([]string{"webhook.enabled=true", "webhook.tlsSecretName=kairon-webhook-tls"}),
			want:  []string{"webhook.enabled=true needs webhook.caBundle"},
		},
		{
			name:  "webhook without Secret",
			flags: append(setArgs([]string{"webhook.enabled=true"}), "--set-string", "webhook.caBundle=Zm9v"),
			want:  []string{"webhook.enabled=true needs webhook.tlsSecretName"},
		},
		{
			name:  "no replicas",
			flags: setArgs([]string{"controller.replicas=0"}),
			want:  []string{"controller.replicas must be at least 1"},
		},
		{
			name:  "relative migration certificate directory",
			flags: setArgs([]string{"migration.tlsHostPath=etc/kairon"}),
			want:  []string{`migration.tlsHostPath="etc/kairon" must be an absolute path`},
		},
		{
			name:  "unknown backend",
			flags: setArgs([]string{"node.backend=firecracker"}),
			want:  []string{`node.backend="firecracker" is not valid`},
		},
		{
			name:  "unknown acceleration",
			flags: setArgs([]string{"node.acceleration=hvf"}),
			want:  []string{`node.acceleration="hvf" is not valid`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stderr := renderError(t, tc.flags...)
			for _, want := range tc.want {
				if !strings.Contains(stderr, want) {
					t.Errorf("helm template %v failed with\n%s\nwhich lacks %q", tc.flags, stderr, want)
				}
			}
		})
	}
}

// testCAPEM is a freshly made self-signed CA certificate, PEM-encoded.
func testCAPEM(t testing.TB) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kairon chart test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestTemplateWebhook(t *testing.T) {
	caPEM := testCAPEM(t)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	base := setArgs([]string{"webhook.enabled=true", "webhook.tlsSecretName=kairon-webhook-tls"})
	for name, caFlags := range map[string][]string{
		// caBundle as the API field wants it, base64 of the PEM...
		"base64": {"--set-string", "webhook.caBundle=" + base64.StdEncoding.EncodeToString(caPEM)},
		// ...or the PEM file itself.
		"PEM file": {"--set-file", "webhook.caBundle=" + caFile},
	} {
		t.Run(name, func(t *testing.T) {
			m := render(t, append(base, caFlags...)...)

			var vwc admissionregistrationv1.ValidatingWebhookConfiguration
			get(t, m, "ValidatingWebhookConfiguration", testRelease+"-kairon-machines", &vwc)
			// kairon-controller -webhook serves both paths.
			want := map[string]struct {
				path       string
				resource   string
				operations []admissionregistrationv1.OperationType
			}{
				"machines.kairon.zyvor.dev": {controller.MachineWebhookPath, "machines",
					[]admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}},
				"machinemigrations.kairon.zyvor.dev": {controller.MachineMigrationWebhookPath, "machinemigrations",
					[]admissionregistrationv1.OperationType{admissionregistrationv1.Create}},
			}
			if len(vwc.Webhooks) != len(want) {
				t.Fatalf("%d webhooks, want %d", len(vwc.Webhooks), len(want))
			}
			for _, w := range vwc.Webhooks {
				exp, ok := want[w.Name]
				if !ok {
					t.Errorf("unexpected webhook %s", w.Name)
					continue
				}
				if !bytes.Equal(bytes.TrimSpace(w.ClientConfig.CABundle), bytes.TrimSpace(caPEM)) {
					t.Errorf("%s: caBundle is\n%s\nwant the CA\n%s", w.Name, w.ClientConfig.CABundle, caPEM)
				}
				if block, _ := pem.Decode(w.ClientConfig.CABundle); block == nil {
					t.Errorf("%s: caBundle holds no PEM block", w.Name)
				} else if _, err := x509.ParseCertificate(block.Bytes); err != nil {
					t.Errorf("%s: caBundle certificate: %v", w.Name, err)
				}
				svc := w.ClientConfig.Service
				if svc == nil || w.ClientConfig.URL != nil {
					t.Errorf("%s: clientConfig %+v: want the controller Service, no URL", w.Name, w.ClientConfig)
					continue
				}
				if svc.Name != controllerName || svc.Namespace != testNamespace ||
					svc.Path == nil || *svc.Path != exp.path || svc.Port == nil || *svc.Port != 9443 {
					t.Errorf("%s: service %s/%s path %v port %v, want %s/%s %s 9443",
						w.Name, svc.Namespace, svc.Name, ptr.Deref(svc.Path, ""), ptr.Deref(svc.Port, 0), testNamespace, controllerName, exp.path)
				}
				if len(w.Rules) != 1 {
					t.Errorf("%s: %d rules, want 1", w.Name, len(w.Rules))
					continue
				}
				r := w.Rules[0]
				if !slices.Equal(r.APIGroups, []string{kaironGroup}) || !slices.Equal(r.APIVersions, []string{"v1alpha1"}) ||
					!slices.Equal(r.Resources, []string{exp.resource}) || !slices.Equal(r.Operations, exp.operations) {
					t.Errorf("%s: rule %+v, want %v of kairon.zyvor.dev/v1alpha1 %s", w.Name, r, exp.operations, exp.resource)
				}
				// The Machine webhook charges quotas, except on a dry run.
				wantSideEffects := admissionregistrationv1.SideEffectClassNone
				if exp.resource == "machines" {
					wantSideEffects = admissionregistrationv1.SideEffectClassNoneOnDryRun
				}
				if w.SideEffects == nil || *w.SideEffects != wantSideEffects {
					t.Errorf("%s: sideEffects %v, want %s", w.Name, w.SideEffects, wantSideEffects)
				}
				if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Fail {
					t.Errorf("%s: failurePolicy %v, want Fail", w.Name, w.FailurePolicy)
				}
				var wantMatch []admissionregistrationv1.MatchCondition
				if exp.resource == "machines" {
					wantMatch = controller.MachineWebhookMatchConditions
				}
				if !reflect.DeepEqual(w.MatchConditions, wantMatch) {
					t.Errorf("%s: matchConditions %+v, want %+v", w.Name, w.MatchConditions, wantMatch)
				}
			}

			var dep appsv1.Deployment
			get(t, m, "Deployment", controllerName, &dep)
			c := onlyContainer(t, dep.Spec.Template.Spec)
			for _, want := range []string{"-webhook", "-webhook-port=9443", "-webhook-cert-dir=" + webhookCertDir} {
				if !slices.Contains(c.Args, want) {
					t.Errorf("args %q lack %s", c.Args, want)
				}
			}
			var volume string
			for _, v := range dep.Spec.Template.Spec.Volumes {
				if v.Secret != nil && v.Secret.SecretName == "kairon-webhook-tls" {
					volume = v.Name
				}
			}
			if volume == "" {
				t.Fatalf("no volume of Secret kairon-webhook-tls in %+v", dep.Spec.Template.Spec.Volumes)
			}
			if !slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool {
				return vm.Name == volume && vm.MountPath == webhookCertDir && vm.ReadOnly
			}) {
				t.Errorf("Secret volume %s not mounted read-only at %s: %+v", volume, webhookCertDir, c.VolumeMounts)
			}
			if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == 9443 }) {
				t.Errorf("container ports %+v lack 9443", c.Ports)
			}
		})
	}
}

// alertRule is the part of a Prometheus alerting rule the tests look at.
type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type ruleGroups struct {
	Groups []struct {
		Name  string      `json:"name"`
		Rules []alertRule `json:"rules"`
	} `json:"groups"`
}

func (g ruleGroups) find(group, alert string) (alertRule, bool) {
	for _, gr := range g.Groups {
		if gr.Name != group {
			continue
		}
		for _, r := range gr.Rules {
			if r.Alert == alert {
				return r, true
			}
		}
	}
	return alertRule{}, false
}

func TestAlertsFile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir(t), "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules ruleGroups
	if err := yaml.UnmarshalStrict(data, &rules); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	r, ok := rules.find("kairon-disruption-budgets", "KaironDisruptionBudgetExhausted")
	if !ok {
		t.Fatalf("alerts.yaml has no alert KaironDisruptionBudgetExhausted in group kairon-disruption-budgets: %+v", rules)
	}
	const wantExpr = `max by (namespace, budget) (kairon_disruption_budget_status{field="disruptions_allowed"}) == 0`
	if got := strings.Join(strings.Fields(r.Expr), " "); got != wantExpr {
		t.Errorf("expr %q, want %q", got, wantExpr)
	}
	if r.For != "10m" {
		t.Errorf("for %q, want 10m", r.For)
	}
	if r.Labels["severity"] != "info" {
		t.Errorf("severity %q, want info", r.Labels["severity"])
	}
	for _, a := range []string{"summary", "description"} {
		if !strings.Contains(r.Annotations[a], "{{ $labels.budget }}") {
			t.Errorf("annotation %s %q does not name the budget", a, r.Annotations[a])
		}
	}
}

func TestTemplateMonitoring(t *testing.T) {
	m := render(t)
	for _, kind := range []string{"ServiceMonitor", "PrometheusRule"} {
		for _, k := range m.keys() {
			if strings.HasPrefix(k, kind+"/") {
				t.Errorf("%s rendered by default", k)
			}
		}
	}

	m = render(t, setArgs([]string{
		"alerts.enabled=true", "alerts.additionalLabels.release=prom",
		"metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.additionalLabels.release=prom",
	})...)

	// The PrometheusRule carries alerts.yaml's groups unchanged.
	rule := getMap(t, m, "PrometheusRule", testRelease+"-kairon")
	data, err := os.ReadFile(filepath.Join(chartDir(t), "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]any
	if err := yaml.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rule["spec"], file) {
		t.Errorf("PrometheusRule spec\n%v\nis not alerts.yaml\n%v", rule["spec"], file)
	}
	if rule["apiVersion"] != "monitoring.coreos.com/v1" {
		t.Errorf("PrometheusRule apiVersion %v", rule["apiVersion"])
	}
	if labels, _ := rule["metadata"].(map[string]any)["labels"].(map[string]any); labels["release"] != "prom" {
		t.Errorf("PrometheusRule labels %v lack alerts.additionalLabels", labels)
	}
	specJSON, err := yaml.Marshal(rule["spec"])
	if err != nil {
		t.Fatal(err)
	}
	var rendered ruleGroups
	if err := yaml.UnmarshalStrict(specJSON, &rendered); err != nil {
		t.Fatal(err)
	}
	if r, ok := rendered.find("kairon-disruption-budgets", "KaironDisruptionBudgetExhausted"); !ok || r.For != "10m" {
		t.Errorf("rendered PrometheusRule lacks the alert with for: 10m: %+v", rendered)
	}

	sm := getMap(t, m, "ServiceMonitor", controllerName)
	var svc corev1.Service
	get(t, m, "Service", controllerName, &svc)
	spec := sm["spec"].(map[string]any)
	selector := spec["selector"].(map[string]any)["matchLabels"].(map[string]any)
	for k, v := range selector {
		if svc.Labels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%v, which the controller Service does not carry", k, v)
		}
	}
	endpoints := spec["endpoints"].([]any)
	if len(endpoints) != 1 || endpoints[0].(map[string]any)["port"] != "metrics" {
		t.Errorf("ServiceMonitor endpoints %v, want the metrics port", endpoints)
	}
	if labels := sm["metadata"].(map[string]any)["labels"].(map[string]any); labels["release"] != "prom" {
		t.Errorf("ServiceMonitor labels %v lack metrics.serviceMonitor.additionalLabels", labels)
	}
	// Secure serving by default: the scrape is HTTPS with the scraper's token.
	ep := endpoints[0].(map[string]any)
	if ep["scheme"] != "https" || ep["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
		t.Errorf("ServiceMonitor endpoint %v: want scheme https and the ServiceAccount token", ep)
	}
}

// Metrics are served only to authorized scrapers unless metrics.secure is
// turned off: the controller may review tokens and access, and a reader role
// exists for the scraper.
func TestSecureMetricsServing(t *testing.T) {
	m := render(t)
	var auth rbacv1.ClusterRole
	get(t, m, "ClusterRole", controllerName+"-metrics-auth", &auth)
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	}
	if !reflect.DeepEqual(auth.Rules, want) {
		t.Errorf("metrics-auth rules %+v, want %+v", auth.Rules, want)
	}
	var b rbacv1.ClusterRoleBinding
	get(t, m, "ClusterRoleBinding", controllerName+"-metrics-auth", &b)
	if len(b.Subjects) != 1 || b.Subjects[0].Name != controllerName || b.RoleRef.Name != controllerName+"-metrics-auth" {
		t.Errorf("metrics-auth binding %+v", b)
	}
	var reader rbacv1.ClusterRole
	get(t, m, "ClusterRole", testRelease+"-kairon-metrics-reader", &reader)
	if len(reader.Rules) != 1 || !slices.Equal(reader.Rules[0].NonResourceURLs, []string{"/metrics"}) || !slices.Equal(reader.Rules[0].Verbs, []string{"get"}) {
		t.Errorf("metrics-reader rules %+v, want get on /metrics only", reader.Rules)
	}

	m = render(t, setArgs([]string{"metrics.secure=false"})...)
	for _, k := range m.keys() {
		if strings.Contains(k, "metrics-auth") || strings.Contains(k, "metrics-reader") {
			t.Errorf("%s rendered with metrics.secure=false", k)
		}
	}
	var dep appsv1.Deployment
	get(t, m, "Deployment", controllerName, &dep)
	if c := onlyContainer(t, dep.Spec.Template.Spec); slices.Contains(c.Args, "-metrics-secure") || !slices.Contains(c.Args, "-metrics-bind-address=:8080") {
		t.Errorf("controller args with metrics.secure=false: %q", c.Args)
	}

	m = render(t, setArgs([]string{"metrics.tlsSecretName=metrics-tls"})...)
	get(t, m, "Deployment", controllerName, &dep)
	c := onlyContainer(t, dep.Spec.Template.Spec)
	if !slices.Contains(c.Args, "-metrics-cert-dir=/etc/kairon/metrics-certs") || len(c.VolumeMounts) != 1 ||
		c.VolumeMounts[0].MountPath != "/etc/kairon/metrics-certs" || dep.Spec.Template.Spec.Volumes[0].Secret.SecretName != "metrics-tls" {
		t.Errorf("metrics.tlsSecretName: args %q mounts %+v volumes %+v", c.Args, c.VolumeMounts, dep.Spec.Template.Spec.Volumes)
	}
}

func nodeDaemonSet(t *testing.T, m manifests) (appsv1.DaemonSet, corev1.Container) {
	t.Helper()
	var ds appsv1.DaemonSet
	get(t, m, "DaemonSet", nodeAgentName, &ds)
	return ds, onlyContainer(t, ds.Spec.Template.Spec)
}

// hostPathVolumes maps mount path to the hostPath volume mounted there.
func hostPathVolumes(ds appsv1.DaemonSet, c corev1.Container) map[string]corev1.HostPathVolumeSource {
	byName := map[string]corev1.Volume{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		byName[v.Name] = v
	}
	out := map[string]corev1.HostPathVolumeSource{}
	for _, vm := range c.VolumeMounts {
		if v, ok := byName[vm.Name]; ok && v.HostPath != nil {
			out[vm.MountPath] = *v.HostPath
		}
	}
	return out
}

func TestTemplateNodeAgent(t *testing.T) {
	ds, c := nodeDaemonSet(t, render(t))
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("node agent not on the host network")
	}
	if spec.ServiceAccountName != nodeAgentName {
		t.Errorf("service account %q, want %q", spec.ServiceAccountName, nodeAgentName)
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Errorf("node agent not privileged: %+v", c.SecurityContext)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Errorf("no NODE_NAME from spec.nodeName in %+v", c.Env)
	}
	wantArgs := []string{
		"--node-name=$(NODE_NAME)", "--backend=qemu", "--acceleration=auto",
		"--network-cidr=10.88.0.0/24", "--bridge=kairon0", "--state-dir=/var/lib/kairon-node",
		// VMs in host cgroups, outliving the pod.
		"--vm-scope=host",
		// No migration certificate by default: no live migration listener,
		// rather than one in plain TCP on every address.
		"--listen=", "--interval=5s", "--lease-renew-interval=10s", "--boot-timeout=5m",
		"--health-probe-bind-address=$(HOST_IP):9440",
		// Egress: both proxies and NAT on the default route, by default.
		"--egress-dns-port=10053", "--egress-dns-upstream=auto", "--egress-sni-port=10054", "--egress-masquerade=auto",
	}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("node agent args %q, want %q", c.Args, wantArgs)
	}
	// The probes reach the agent on the node's own address.
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "HOST_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP"
	}) {
		t.Errorf("no HOST_IP from status.hostIP in %+v", c.Env)
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.StrVal != "health" {
		t.Errorf("liveness probe %+v, want GET /healthz on the health port", p)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.StrVal != "health" {
		t.Errorf("readiness probe %+v, want GET /readyz on the health port", p)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "health" || c.Ports[0].ContainerPort != 9440 {
		t.Errorf("node agent ports %+v, want health 9440", c.Ports)
	}
	// A console server verifies client certificates against the cluster CA.
	if _, noEgress := nodeDaemonSet(t, render(t, setArgs([]string{"node.egress.dnsPort=0", "node.egress.sniPort=0", "node.egress.masquerade="})...)); slices.ContainsFunc(noEgress.Args, func(a string) bool {
		return strings.HasPrefix(a, "--egress-dns") || strings.HasPrefix(a, "--egress-sni")
	}) || !slices.Contains(noEgress.Args, "--egress-masquerade=none") {
		t.Errorf("egress proxies and NAT off: args %q", noEgress.Args)
	}
	// Guests on several nodes: the cluster range instead of the node's own.
	for routing, want := range map[string][]string{
		"host":  {"--cluster-guest-cidr=10.90.0.0/16", "--node-guest-prefix=26", "--cross-node-routing=host"},
		"vxlan": {"--cluster-guest-cidr=10.90.0.0/16", "--node-guest-prefix=26", "--cross-node-routing=vxlan", "--vxlan-id=7", "--vxlan-port=8472"},
	} {
		_, cross := nodeDaemonSet(t, render(t, setArgs([]string{"node.crossNode.clusterGuestCIDR=10.90.0.0/16", "node.crossNode.nodeGuestPrefix=26",
			"node.crossNode.routing=" + routing, "node.crossNode.vxlanID=7", "node.crossNode.vxlanPort=8472"})...))
		var got []string
		for _, a := range cross.Args {
			if strings.HasPrefix(a, "--cluster-guest") || strings.HasPrefix(a, "--node-guest") || strings.HasPrefix(a, "--cross-node") ||
				strings.HasPrefix(a, "--vxlan") || strings.HasPrefix(a, "--network-cidr") {
				got = append(got, a)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("node.crossNode with routing %s: network args %q, want %q", routing, got, want)
		}
	}
	if _, withConsole := nodeDaemonSet(t, render(t, setArgs([]string{"node.listen=0.0.0.0:10251"})...)); !slices.Contains(withConsole.Args, "--client-ca-file=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt") {
		t.Errorf("node.listen set: args %q lack the console client CA", withConsole.Args)
	}
	if _, off := nodeDaemonSet(t, render(t, setArgs([]string{"node.healthProbePort=0"})...)); off.LivenessProbe != nil || off.ReadinessProbe != nil ||
		slices.ContainsFunc(off.Args, func(a string) bool { return strings.HasPrefix(a, "--health-probe-bind-address") }) {
		t.Errorf("node.healthProbePort=0 still probes: args %q", off.Args)
	}
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--register") || strings.HasPrefix(a, "-register") {
			t.Errorf("node agent runs with %s: the Node belongs to the kubelet", a)
		}
	}
	mounts := hostPathVolumes(ds, c)
	if v, ok := mounts["/var/lib/kairon-node"]; !ok || v.Path != "/var/lib/kairon-node" || v.Type == nil || *v.Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("state dir hostPath %+v, want /var/lib/kairon-node DirectoryOrCreate", v)
	}
	if v, ok := mounts["/dev/net/tun"]; !ok || v.Path != "/dev/net/tun" || v.Type == nil || *v.Type != corev1.HostPathCharDev {
		t.Errorf("/dev/net/tun hostPath %+v, want a CharDevice", v)
	}
	// With acceleration auto a node without KVM must still run the agent
	// (on TCG), so /dev/kvm is not a required mount; the privileged
	// container sees the host's devices.
	if _, ok := mounts["/dev/kvm"]; ok {
		t.Error("acceleration auto mounts /dev/kvm as a required CharDevice, so nodes without KVM could not run the agent")
	}

	t.Run("kvm", func(t *testing.T) {
		ds, c := nodeDaemonSet(t, render(t, "--set", "node.acceleration=kvm"))
		if v, ok := hostPathVolumes(ds, c)["/dev/kvm"]; !ok || v.Path != "/dev/kvm" || v.Type == nil || *v.Type != corev1.HostPathCharDev {
			t.Errorf("/dev/kvm hostPath %+v, want a CharDevice", v)
		}
		if !slices.Contains(c.Args, "--acceleration=kvm") {
			t.Errorf("args %q lack --acceleration=kvm", c.Args)
		}
	})

	t.Run("sim and options", func(t *testing.T) {
		ds, c := nodeDaemonSet(t, render(t, append(setArgs([]string{
			"node.backend=sim", "node.networkCIDR=10.99.0.0/24", "node.stateDir=/srv/kairon",
			"migration.tlsSecretName=kairon-migration-tls", "node.resources.limits.memory=1Gi",
		}), "--set-string", `node.nodeSelector.kairon\.zyvor\.dev/host=true`)...))
		for _, want := range []string{"--backend=sim", "--network-cidr=10.99.0.0/24", "--state-dir=/srv/kairon",
			"--migration-listen=:10251", "--migration-tls-dir=/etc/kairon/migration-tls"} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("args %q lack %s", c.Args, want)
			}
		}
		mounts := hostPathVolumes(ds, c)
		if _, ok := mounts["/dev/net/tun"]; ok {
			t.Error("the sim backend mounts /dev/net/tun")
		}
		if v := mounts["/srv/kairon"]; v.Path != "/srv/kairon" {
			t.Errorf("state hostPath %+v, want /srv/kairon", v)
		}
		if got := ds.Spec.Template.Spec.NodeSelector; !reflect.DeepEqual(got, map[string]string{"kubernetes.io/os": "linux", "kairon.zyvor.dev/host": "true"}) {
			t.Errorf("nodeSelector %v", got)
		}
		if got := c.Resources.Limits.Memory().String(); got != "1Gi" {
			t.Errorf("memory limit %s, want 1Gi", got)
		}
		if !slices.ContainsFunc(ds.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
			return v.Secret != nil && v.Secret.SecretName == "kairon-migration-tls"
		}) {
			t.Errorf("migration.tlsSecretName not mounted: %+v", ds.Spec.Template.Spec.Volumes)
		}
	})

	t.Run("migration over per-node certificates", func(t *testing.T) {
		ds, c := nodeDaemonSet(t, render(t, setArgs([]string{"migration.tlsHostPath=/etc/kairon/node-migration-tls"})...))
		for _, want := range []string{"--migration-listen=:10251", "--migration-tls-dir=/etc/kairon/migration-tls"} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("args %q lack %s", c.Args, want)
			}
		}
		if v, ok := hostPathVolumes(ds, c)["/etc/kairon/migration-tls"]; !ok || v.Path != "/etc/kairon/node-migration-tls" || v.Type == nil || *v.Type != corev1.HostPathDirectory {
			t.Errorf("migration.tlsHostPath mounted as %+v, want /etc/kairon/node-migration-tls, a Directory", v)
		}
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--migration-insecure") {
				t.Errorf("the chart passes %s", a)
			}
		}
	})

	t.Run("no migration listener without a certificate", func(t *testing.T) {
		_, c := nodeDaemonSet(t, render(t, setArgs([]string{"migration.listen=0.0.0.0:10251"})...))
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--migration-listen") || strings.HasPrefix(a, "--migration-insecure") {
				t.Errorf("without migration.tlsHostPath or tlsSecretName the agent runs with %s: live migration in plain TCP", a)
			}
		}
	})

	t.Run("disabled", func(t *testing.T) {
		m := render(t, "--set", "node.enabled=false")
		for _, k := range m.keys() {
			if strings.HasSuffix(k, "/"+nodeAgentName) {
				t.Errorf("node.enabled=false still renders %s", k)
			}
		}
		if !m.has("Deployment", controllerName) {
			t.Error("node.enabled=false drops the controller")
		}
	})
}

// TestRenderedFlagsExist runs kairon-controller and kairon-node, built from
// this checkout, with exactly the arguments the chart renders plus -h: a
// flag the binary does not define makes it fail instead of printing usage.
func TestRenderedFlagsExist(t *testing.T) {
	bin := buildCommands(t, "kairon-controller", "kairon-node")
	ca := base64.StdEncoding.EncodeToString(testCAPEM(t))

	controllerUsage := func(args []string) (string, error) {
		out, err := exec.Command(filepath.Join(bin, "kairon-controller"), append(slices.Clone(args), "-h")...).CombinedOutput()
		return string(out), err
	}
	usage, err := controllerUsage(nil)
	if err != nil {
		t.Fatalf("kairon-controller -h: %v\n%s", err, usage)
	}
	if !strings.Contains(usage, "-cordon-evacuate") {
		t.Errorf("kairon-controller -h does not list -cordon-evacuate, which the chart passes when controller.cordonEvacuation.enabled:\n%s", usage)
	}

	for name, flags := range map[string][]string{
		"defaults":          nil,
		"leader election":   setArgs([]string{"controller.replicas=3"}),
		"webhook":           append(setArgs([]string{"webhook.enabled=true", "webhook.tlsSecretName=tls"}), "--set-string", "webhook.caBundle="+ca),
		"cordon evacuation": setArgs([]string{"controller.cordonEvacuation.enabled=true", "controller.cordonEvacuation.strategy=auto"}),
	} {
		t.Run("controller "+name, func(t *testing.T) {
			args := controllerArgs(t, render(t, flags...))
			if out, err := controllerUsage(args); err != nil {
				t.Errorf("kairon-controller %s -h: %v\n%s", strings.Join(args, " "), err, out)
			}
		})
	}

	for name, sets := range map[string][]string{
		"defaults":                nil,
		"sim":                     {"node.backend=sim", "node.acceleration=tcg", "node.guestDir=/opt/kairon/guest", "node.listen=127.0.0.1:10350"},
		"shared snapshot storage": {"node.snapshots.dir=/mnt/kairon-snapshots", "node.snapshots.store=nfs-a"},
		// Pull secrets asked of the controller.
		"webhook": {"webhook.enabled=true", "webhook.tlsSecretName=tls", "webhook.caBundle=Zm9v"},
	} {
		t.Run("node "+name, func(t *testing.T) {
			_, c := nodeDaemonSet(t, render(t, setArgs(sets)...))
			var args []string
			for _, a := range c.Args {
				args = append(args, strings.ReplaceAll(a, "$(NODE_NAME)", "worker-1"))
			}
			out, err := exec.Command(filepath.Join(bin, "kairon-node"), append(args, "-h")...).CombinedOutput()
			if err != nil || strings.Contains(string(out), "not defined") {
				t.Errorf("kairon-node %s -h: %v\n%s", strings.Join(args, " "), err, out)
			}
		})
	}
}

// buildCommands builds cmd/<name> of this checkout into a temporary
// directory and returns it. Under make test, which has just built every
// command into $KAIRON_BIN_DIR, it returns that directory instead, as the
// e2e tests run the commands from there.
func buildCommands(t *testing.T, names ...string) string {
	t.Helper()
	if dir := os.Getenv(host.BinDirEnv); dir != "" && allFiles(dir, names) {
		return dir
	}
	// go test puts its own go first in the test's PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("finding the go command to build with: %v", err)
	}
	dir := t.TempDir()
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, "./cmd/"+n)
	}
	cmd := exec.Command(goBin, args...)
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return dir
}

func allFiles(dir string, names []string) bool {
	for _, n := range names {
		if st, err := os.Stat(filepath.Join(dir, n)); err != nil || !st.Mode().IsRegular() {
			return false
		}
	}
	return true
}
