package chart

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/zyvor/kairon/internal/controller"
)

// TestTemplatePullCredentials: the node agents share one ServiceAccount,
// so with the webhook on they fetch their Machines' pull secrets from
// kairon-controller's webhook server, trusting the webhook's CA (a
// ConfigMap of webhook.caBundle, mounted), and the controller knows their
// ServiceAccount. Without the webhook there is no such server: none of it
// is rendered.
func TestTemplatePullCredentials(t *testing.T) {
	caPEM := testCAPEM(t)
	m := render(t, append(setArgs([]string{"webhook.enabled=true", "webhook.tlsSecretName=kairon-webhook-tls"}),
		"--set-string", "webhook.caBundle="+base64.StdEncoding.EncodeToString(caPEM))...)

	var cm corev1.ConfigMap
	get(t, m, "ConfigMap", controllerName+"-ca", &cm)
	if strings.TrimSpace(cm.Data["ca.crt"]) != strings.TrimSpace(string(caPEM)) {
		t.Errorf("ConfigMap %s-ca ca.crt:\n%s\nwant the webhook's CA:\n%s", controllerName, cm.Data["ca.crt"], caPEM)
	}
	ds, c := nodeDaemonSet(t, m)
	wantArgs := []string{
		"--pull-credentials-url=https://" + controllerName + "." + testNamespace + ".svc:9443" + controller.PullCredentialsPath,
		"--pull-credentials-ca=/etc/kairon/controller-ca/ca.crt",
	}
	for _, a := range wantArgs {
		if !slices.Contains(c.Args, a) {
			t.Errorf("node agent args %q lack %s", c.Args, a)
		}
	}
	mounted := slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool {
		return vm.Name == "controller-ca" && vm.MountPath == "/etc/kairon/controller-ca" && vm.ReadOnly
	})
	volume := slices.ContainsFunc(ds.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return v.Name == "controller-ca" && v.ConfigMap != nil && v.ConfigMap.Name == controllerName+"-ca"
	})
	if !mounted || !volume {
		t.Errorf("node agent: controller-ca mounted %v, volume of ConfigMap %s-ca %v; mounts %+v", mounted, controllerName, volume, c.VolumeMounts)
	}
	var dep appsv1.Deployment
	get(t, m, "Deployment", controllerName, &dep)
	wantSA := "-node-service-account=system:serviceaccount:" + testNamespace + ":" + nodeAgentName
	if args := onlyContainer(t, dep.Spec.Template.Spec).Args; !slices.Contains(args, wantSA) {
		t.Errorf("controller args %q lack %s", args, wantSA)
	}

	m = render(t)
	if m.has("ConfigMap", controllerName+"-ca") {
		t.Error("ConfigMap of the webhook CA rendered without the webhook")
	}
	ds, c = nodeDaemonSet(t, m)
	if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--pull-credentials") }) ||
		slices.ContainsFunc(ds.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "controller-ca" }) {
		t.Errorf("without the webhook the node agent still asks the controller: args %q", c.Args)
	}
}
