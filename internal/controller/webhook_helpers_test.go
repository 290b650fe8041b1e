package controller

import (
	"context"
	"strconv"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// webhookServer is where startWebhookControllers serves the webhooks: a
// port of 127.0.0.1, with a serving certificate signed by caPEM.
type webhookServer struct {
	port  int
	caPEM []byte
}

// startWebhookControllers is startControllers with the webhooks on, served
// over TLS, the only way the API server calls them.
func startWebhookControllers(t *testing.T, env *testenv.Env, ns string, opts Options) webhookServer {
	t.Helper()
	certDir, caPEM := writeServingCert(t)
	srv := webhookServer{port: freePort(t), caPEM: caPEM}
	opts.Webhook = true
	startControllers(t, env, ns, opts, func(o *ctrl.Options) {
		o.WebhookServer = webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: srv.port, CertDir: certDir})
	})
	return srv
}

// register points the API server at the webhook served at path for ops on
// the resources (plural names; a subresource as "machinemigrations/status")
// in namespace ns only, so other tests sharing the API server are not
// affected, and removes the configuration when the test ends. The first
// resource names the webhook, as the chart does (machines.kairon.zyvor.dev).
func (s webhookServer) register(t *testing.T, env *testenv.Env, ns, path string,
	ops []admissionregistrationv1.OperationType, resources ...string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	t.Helper()
	url := "https://127.0.0.1:" + strconv.Itoa(s.port) + path
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + resources[0]},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    resources[0] + "." + kaironv1.GroupVersion.Group,
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: s.caPEM},
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             ptr.To(sideEffectsOf(resources[0])),
			MatchConditions:         matchConditionsOf(resources[0]),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			TimeoutSeconds:          ptr.To[int32](10),
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
				"kubernetes.io/metadata.name": ns,
			}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: ops,
				Rule: admissionregistrationv1.Rule{
					APIGroups:   []string{kaironv1.GroupVersion.Group},
					APIVersions: []string{kaironv1.GroupVersion.Version},
					Resources:   resources,
					Scope:       ptr.To(admissionregistrationv1.NamespacedScope),
				},
			}},
		}},
	}
	if err := env.Client.Create(context.Background(), cfg); err != nil {
		t.Fatalf("creating webhook configuration: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), cfg); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting webhook configuration: %v", err)
		}
	})
	return cfg
}

// sideEffectsOf is what the chart declares: the Machine webhook charges
// quotas except on a dry run.
// matchConditionsOf is what the chart's webhook for resource sends it.
func matchConditionsOf(resource string) []admissionregistrationv1.MatchCondition {
	if resource == "machines" {
		return MachineWebhookMatchConditions
	}
	return nil
}

func sideEffectsOf(resource string) admissionregistrationv1.SideEffectClass {
	if resource == "machines" {
		return admissionregistrationv1.SideEffectClassNoneOnDryRun
	}
	return admissionregistrationv1.SideEffectClassNone
}
