package chart

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/ui"
)

const uiName = testRelease + "-kairon-ui"

// uiObjects are what ui.enabled adds.
var uiObjects = []string{
	"ClusterRole/" + uiName, "ClusterRoleBinding/" + uiName, "Deployment/" + uiName,
	"Service/" + uiName, "ServiceAccount/" + uiName,
}

// TestTemplateUI: kairon-ui is off by default; on, it is a Deployment of
// its own image (the controller's registry and tag) running kairon-ui with --auth token on ui.port,
// --allow-write only with ui.allowWrite, behind a Service on that port, as
// a ServiceAccount that may only read.
func TestTemplateUI(t *testing.T) {
	defaults := render(t)
	for _, k := range uiObjects {
		if _, ok := defaults[k]; ok {
			t.Errorf("the default values render %s: kairon-ui must be off by default", k)
		}
	}

	m := render(t, setArgs([]string{"ui.enabled=true", "ui.port=9000"})...)
	for _, k := range uiObjects {
		if _, ok := m[k]; !ok {
			t.Errorf("ui.enabled=true does not render %s", k)
		}
	}
	var dep, controller appsv1.Deployment
	get(t, m, "Deployment", uiName, &dep)
	get(t, m, "Deployment", controllerName, &controller)
	c := onlyContainer(t, dep.Spec.Template.Spec)
	if want := strings.Replace(onlyContainer(t, controller.Spec.Template.Spec).Image, "/kairon-controller:", "/kairon-ui:", 1); c.Image != want {
		t.Errorf("kairon-ui image %q, want %q (the controller's registry and tag)", c.Image, want)
	}
	if !slices.Equal(c.Command, []string{"kairon-ui"}) {
		t.Errorf("kairon-ui command %q", c.Command)
	}
	if want := []string{"--auth=token", "--listen=:9000"}; !slices.Equal(c.Args, want) {
		t.Errorf("kairon-ui args %q, want %q", c.Args, want)
	}
	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != 9000 || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("kairon-ui ports %+v, readiness %+v", c.Ports, c.ReadinessProbe)
	}
	if dep.Spec.Template.Spec.ServiceAccountName != uiName {
		t.Errorf("kairon-ui ServiceAccount %q, want %q", dep.Spec.Template.Spec.ServiceAccountName, uiName)
	}
	if sc := c.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("kairon-ui security context %+v", sc)
	}
	var svc corev1.Service
	get(t, m, "Service", uiName, &svc)
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9000 || svc.Spec.Ports[0].TargetPort.String() != "http" {
		t.Errorf("kairon-ui Service ports %+v", svc.Spec.Ports)
	}
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("the Service selects %s=%s, which kairon-ui's pods do not carry", k, v)
		}
	}
	if controller.Spec.Selector.MatchLabels["app.kubernetes.io/component"] == dep.Spec.Template.Labels["app.kubernetes.io/component"] {
		t.Error("the controller Deployment's selector matches kairon-ui's pods")
	}
	checkBinding(t, m, uiName)

	// Read only: get, list and watch of what it shows, and asking what an
	// identity may do.
	var role rbacv1.ClusterRole
	get(t, m, "ClusterRole", uiName, &role)
	checkNoWildcards(t, role.Rules)
	for _, r := range role.Rules {
		for _, v := range r.Verbs {
			if !slices.Contains([]string{"get", "list", "watch"}, v) && !(v == "create" && slices.Equal(r.Resources, []string{"selfsubjectaccessreviews"})) {
				t.Errorf("kairon-ui's ClusterRole grants %s on %v/%v", v, r.APIGroups, r.Resources)
			}
		}
	}
	for _, gr := range [][2]string{
		{kaironGroup, "machines"}, {kaironGroup, "machinepools"}, {kaironGroup, "machineclaims"}, {kaironGroup, "machinemigrations"},
		{kaironGroup, "machinenetworkpolicies"}, {kaironGroup, "machinedisruptionbudgets"}, {"", "nodes"}, {"events.k8s.io", "events"},
	} {
		for _, verb := range []string{"list", "watch"} {
			if !allows(role.Rules, gr[0], gr[1], verb) {
				t.Errorf("kairon-ui's ClusterRole does not allow %s %s.%s", verb, gr[1], gr[0])
			}
		}
	}

	m = render(t, setArgs([]string{"ui.enabled=true", "ui.allowWrite=true"})...)
	get(t, m, "Deployment", uiName, &dep)
	if want := []string{"--auth=token", "--listen=:8090", "--allow-write"}; !slices.Equal(onlyContainer(t, dep.Spec.Template.Spec).Args, want) {
		t.Errorf("ui.allowWrite=true: args %q, want %q", onlyContainer(t, dep.Spec.Template.Spec).Args, want)
	}
	// allowWrite adds no right to kairon-ui's own identity: the actions
	// are made with the user's.
	var writeRole rbacv1.ClusterRole
	get(t, m, "ClusterRole", uiName, &writeRole)
	if !slices.EqualFunc(writeRole.Rules, role.Rules, func(a, b rbacv1.PolicyRule) bool { return a.String() == b.String() }) {
		t.Errorf("ui.allowWrite=true changes kairon-ui's ClusterRole:\n%+v\nwant\n%+v", writeRole.Rules, role.Rules)
	}

	// ui.tls.secretName: the Secret mounted read-only, kairon-ui given its
	// files, and the probes and the Service speaking HTTPS.
	if c.VolumeMounts != nil || dep.Spec.Template.Spec.Volumes != nil || c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTP {
		t.Errorf("without ui.tls: mounts %+v, volumes %+v, probe scheme %q", c.VolumeMounts, dep.Spec.Template.Spec.Volumes, c.ReadinessProbe.HTTPGet.Scheme)
	}
	m = render(t, setArgs([]string{"ui.enabled=true", "ui.tls.secretName=ui-cert"})...)
	get(t, m, "Deployment", uiName, &dep)
	c = onlyContainer(t, dep.Spec.Template.Spec)
	if want := []string{"--auth=token", "--listen=:8090", "--tls-cert-file=/etc/kairon-ui/tls/tls.crt", "--tls-private-key-file=/etc/kairon-ui/tls/tls.key"}; !slices.Equal(c.Args, want) {
		t.Errorf("ui.tls.secretName: args %q, want %q", c.Args, want)
	}
	vols := dep.Spec.Template.Spec.Volumes
	if len(vols) != 1 || vols[0].Secret == nil || vols[0].Secret.SecretName != "ui-cert" ||
		len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != vols[0].Name || c.VolumeMounts[0].MountPath != "/etc/kairon-ui/tls" || !c.VolumeMounts[0].ReadOnly {
		t.Errorf("ui.tls.secretName: volumes %+v, mounts %+v", vols, c.VolumeMounts)
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || p.HTTPGet.Port.String() != "https" {
			t.Errorf("ui.tls.secretName: probe %+v, want HTTPS on the https port", p)
		}
	}
	get(t, m, "Service", uiName, &svc)
	if len(c.Ports) != 1 || c.Ports[0].Name != "https" || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "https" {
		t.Errorf("ui.tls.secretName: container ports %+v, Service ports %+v", c.Ports, svc.Spec.Ports)
	}

	if out := renderError(t, setArgs([]string{"ui.enabled=true", "ui.port=70000"})...); !strings.Contains(out, "ui.port=70000 is not a TCP port") {
		t.Errorf("ui.port=70000: %s", out)
	}
}

// TestRenderedUIFlagsExist runs kairon-ui, built from this checkout, with
// the arguments the chart renders plus -h.
func TestRenderedUIFlagsExist(t *testing.T) {
	bin := buildCommands(t, "kairon-ui")
	for _, sets := range [][]string{{"ui.enabled=true"}, {"ui.enabled=true", "ui.allowWrite=true", "ui.port=9000"}, {"ui.enabled=true", "ui.tls.secretName=ui-cert"}} {
		var dep appsv1.Deployment
		get(t, render(t, setArgs(sets)...), "Deployment", uiName, &dep)
		args := onlyContainer(t, dep.Spec.Template.Spec).Args
		out, err := exec.Command(filepath.Join(bin, "kairon-ui"), append(slices.Clone(args), "-h")...).CombinedOutput()
		if err != nil || strings.Contains(string(out), "not defined") {
			t.Errorf("kairon-ui %s -h: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestInstallUI installs the chart with ui.enabled on the real API server
// and runs kairon-ui as its ServiceAccount, with a token of it: the chart's
// read-only RBAC fills every informer with no request refused, requests
// without a user's token are 401 (the ServiceAccount's rights are lent to
// nobody), and the ServiceAccount itself may write nothing it shows.
func TestInstallUI(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	const release = "kui"
	name := release + "-kairon-ui"
	kube := []string{"--kubeconfig", env.Kubeconfig, "--namespace", ns}
	values := []string{"ui.enabled=true", "ui.allowWrite=true", "node.enabled=false", "admissionPolicies.enabled=false"}
	mustHelm(t, append(append([]string{"install", release, chartDir(t), "--timeout", "2m"}, setArgs(values)...), kube...)...)
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			_, _, _ = runHelm(t, append([]string{"uninstall", release}, kube...)...)
		}
	})
	var dep appsv1.Deployment
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &dep); err != nil {
		t.Fatalf("kairon-ui Deployment: %v", err)
	}

	cfg, denied := serviceAccountConfig(t, env, ns, name)
	srv, err := ui.New(cfg, ui.Options{Auth: ui.AuthToken, AllowWrite: true, SyncTimeout: installTimeout})
	if err != nil {
		t.Fatal(err)
	}
	uiCtx, stop := context.WithCancel(ctx)
	defer stop()
	if err := srv.Start(uiCtx); err != nil {
		t.Fatalf("kairon-ui as the chart's ServiceAccount: %v (refused: %v)", err, denied.list())
	}
	if d := denied.list(); len(d) > 0 {
		t.Errorf("the API server refused kairon-ui's ServiceAccount: %v", d)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	for _, path := range []string{"/api/v1/machines", "/api/v1/nodes"} {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without a user's token: %s, want 401", path, resp.Status)
		}
	}

	// Its own identity may only read.
	sa, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	mig := &kaironv1.MachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m"}, Spec: kaironv1.MachineMigrationSpec{MachineName: "x"}}
	if err := sa.Create(ctx, mig, client.DryRunAll); !apierrors.IsForbidden(err) {
		t.Errorf("kairon-ui's ServiceAccount creating a MachineMigration: %v, want forbidden", err)
	}
	pool := &kaironv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}}
	if err := sa.SubResource("scale").Patch(ctx, pool, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":1}}`))); !apierrors.IsForbidden(err) {
		t.Errorf("kairon-ui's ServiceAccount scaling a MachinePool: %v, want forbidden", err)
	}

	mustHelm(t, append([]string{"uninstall", release}, kube...)...)
	uninstalled = true
	eventually(t, "kairon-ui's objects to go", func() (bool, string) {
		var left []string
		for _, obj := range []client.Object{
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}},
		} {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); !apierrors.IsNotFound(err) {
				left = append(left, obj.GetName())
			}
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
}
