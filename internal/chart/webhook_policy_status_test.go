package chart

import (
	"bytes"
	"encoding/base64"
	"reflect"
	"slices"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/utils/ptr"

	"github.com/zyvor/kairon/internal/controller"
)

// TestTemplatePolicyStatusWebhook (issue 42): with the webhook on, the
// chart points the API server at kairon-controller's policy-status
// webhook for the node agents' writes of MachineNetworkPolicy status,
// with the node-confinement policy's match conditions (the chart's node
// ServiceAccount filled in), failing closed whatever
// webhook.failurePolicy says.
func TestTemplatePolicyStatusWebhook(t *testing.T) {
	caPEM := testCAPEM(t)
	m := render(t, append(setArgs([]string{"webhook.enabled=true", "webhook.tlsSecretName=kairon-webhook-tls", "webhook.failurePolicy=Ignore"}),
		"--set-string", "webhook.caBundle="+base64.StdEncoding.EncodeToString(caPEM))...)
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	get(t, m, "ValidatingWebhookConfiguration", testRelease+"-kairon-node-confinement", &vwc)
	if len(vwc.Webhooks) != 1 {
		t.Fatalf("%d webhooks, want 1", len(vwc.Webhooks))
	}
	w := vwc.Webhooks[0]
	if w.Name != "machinenetworkpolicies-status.kairon.zyvor.dev" {
		t.Errorf("webhook %s, want machinenetworkpolicies-status.kairon.zyvor.dev", w.Name)
	}
	if svc := w.ClientConfig.Service; svc == nil || svc.Name != controllerName || svc.Namespace != testNamespace ||
		ptr.Deref(svc.Path, "") != controller.PolicyStatusWebhookPath || ptr.Deref(svc.Port, 0) != 9443 {
		t.Errorf("clientConfig %+v, want %s/%s %s 9443", w.ClientConfig, testNamespace, controllerName, controller.PolicyStatusWebhookPath)
	}
	if !bytes.Equal(bytes.TrimSpace(w.ClientConfig.CABundle), bytes.TrimSpace(caPEM)) {
		t.Errorf("caBundle %s, want the CA", w.ClientConfig.CABundle)
	}
	if len(w.Rules) != 1 || !slices.Equal(w.Rules[0].Resources, []string{"machinenetworkpolicies/status"}) ||
		!slices.Equal(w.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Update}) ||
		!slices.Equal(w.Rules[0].APIGroups, []string{kaironGroup}) {
		t.Errorf("rules %+v, want UPDATE of kairon.zyvor.dev machinenetworkpolicies/status", w.Rules)
	}
	if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail despite webhook.failurePolicy=Ignore", w.FailurePolicy)
	}
	if w.SideEffects == nil || *w.SideEffects != admissionregistrationv1.SideEffectClassNone {
		t.Errorf("sideEffects %v, want None", w.SideEffects)
	}
	want, err := controller.PolicyStatusWebhookMatchConditions("system:serviceaccount:" + testNamespace + ":" + nodeAgentName)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(w.MatchConditions, want) {
		t.Errorf("matchConditions %+v, want the policy's %+v", w.MatchConditions, want)
	}
}
