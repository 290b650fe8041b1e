package confinement_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/controller"
	"github.com/zyvor/kairon/internal/testenv"
)

// servePolicyStatusWebhook serves kairon-controller's policy-status
// webhook on a port of 127.0.0.1, reading Machines through reader, and
// points the API server at it for namespace ns, with the match conditions
// the chart gives it, until the test ends or stop is called.
func servePolicyStatusWebhook(t *testing.T, adm client.Client, ns string) (stop func()) {
	t.Helper()
	certDir, caPEM := servingCert(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	srv := webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: certDir})
	srv.Register(controller.PolicyStatusWebhookPath, controller.NewPolicyStatusWebhook(scheme, adm))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	testenv.Eventually(t, time.Minute, "the webhook server started", func() (bool, string) {
		err := srv.StartedChecker()(&http.Request{})
		return err == nil, fmt.Sprint(err)
	})

	conditions, err := controller.PolicyStatusWebhookMatchConditions("") // kairon-local's agents use certificates only
	if err != nil {
		t.Fatal(err)
	}
	url := "https://127.0.0.1:" + strconv.Itoa(port) + controller.PolicyStatusWebhookPath
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-policy-status"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "machinenetworkpolicies-status." + kaironv1.GroupVersion.Group,
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			TimeoutSeconds:          ptr.To[int32](10),
			MatchConditions:         conditions,
			// Only this test's namespace: the other tests share the API server.
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{
					APIGroups:   []string{kaironv1.GroupVersion.Group},
					APIVersions: []string{kaironv1.GroupVersion.Version},
					Resources:   []string{"machinenetworkpolicies/status"},
					Scope:       ptr.To(admissionregistrationv1.NamespacedScope),
				},
			}},
		}},
	}
	if err := adm.Create(context.Background(), cfg); err != nil {
		t.Fatalf("creating the webhook configuration: %v", err)
	}
	t.Cleanup(func() { _ = adm.Delete(context.Background(), cfg) })
	return stop
}

// servingCert writes a self-signed serving certificate for 127.0.0.1 as
// tls.crt and tls.key in a new directory, and returns it with the
// certificate's PEM (the webhook's CA bundle).
func servingCert(t *testing.T) (string, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "policy-status-webhook"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, certPEM
}

// TestAgentReportsOnlyItsOwnMachines (issue 42): node agent A, with its
// own certificate, writes its own entry of a policy's status.nodes (which
// the ValidatingAdmissionPolicy lets it) naming a Machine placed on node B,
// one that does not exist and one placed nowhere: kairon-controller's
// webhook refuses each, naming the Machine. Its own Machine is accepted.
// Writes of others than node agents are not sent to the webhook, and with
// the webhook down the agents' reports are refused, not let through.
func TestAgentReportsOnlyItsOwnMachines(t *testing.T) {
	cp := controlPlane(t)
	ctx := context.Background()
	adm := admin(t, cp)
	a, b := "report-a", "report-b"
	makeNode(t, adm, a)
	makeNode(t, adm, b)
	agentA := agent(t, cp, a)
	ns := makeNamespace(t, adm)
	makeMachine(t, adm, ns, "on-a", a)
	makeMachine(t, adm, ns, "on-a2", a)
	makeMachine(t, adm, ns, "on-b", b)
	makeMachine(t, adm, ns, "unplaced", "")
	p := &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "egress"}, Spec: kaironv1.MachineNetworkPolicySpec{MachineName: "on-a"}}
	if err := adm.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	stop := servePolicyStatusWebhook(t, adm, ns)
	report := func(c client.Client, entries ...map[string]any) error {
		count := 0
		for _, e := range entries {
			count += len(e["machines"].([]string))
		}
		return mergePatch(ctx, c, p, map[string]any{"status": map[string]any{"nodes": entries, "machines": count}}, true)
	}
	entry := func(node string, machines ...string) map[string]any {
		return map[string]any{"node": node, "machines": machines, "observedGeneration": 1}
	}

	// The configuration takes a moment to reach the API server's
	// admission chain.
	foreign := "user kairon:node:" + a + " may list in the status.nodes entry of node " + a + " only Machines placed on " + a + ": machine " + ns + "/on-b is not, which is placed on node " + b
	testenv.Eventually(t, time.Minute, "node A listing node B's Machine to be refused", func() (bool, string) {
		err := report(agentA, entry(a, "on-a", "on-b"))
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), foreign), fmt.Sprint(err)
	})
	refused(t, "list only node B's Machine", report(agentA, entry(a, "on-b")), "machine "+ns+"/on-b is not, which is placed on node "+b)
	refused(t, "list a Machine that does not exist", report(agentA, entry(a, "on-a", "ghost")), "machine "+ns+"/ghost is not, which does not exist")
	refused(t, "list a Machine placed on no node", report(agentA, entry(a, "unplaced")), "machine "+ns+"/unplaced is not, which is placed on no node")
	allowed(t, "list its own Machine", report(agentA, entry(a, "on-a")))
	allowed(t, "add another of its own Machines", report(agentA, entry(a, "on-a", "on-a2")))
	refused(t, "add node B's Machine to its accepted report", report(agentA, entry(a, "on-a", "on-a2", "on-b")), "machine "+ns+"/on-b is not")
	got := &kaironv1.MachineNetworkPolicy{}
	if err := adm.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Nodes) != 1 || strings.Join(got.Status.Nodes[0].Machines, ",") != "on-a,on-a2" {
		t.Errorf("status.nodes %+v, want node A's entry with on-a and on-a2 only", got.Status.Nodes)
	}
	// Only node agents' writes are sent: an admin's goes through (the
	// API server does not call the webhook for it).
	allowed(t, "an admin writing an entry the webhook would refuse", report(adm, entry(a, "on-a", "on-a2"), entry(b, "ghost")))

	// Fail closed: with no webhook answering, a node's report is refused.
	// The write only drops a Machine: the webhook would allow it, and so
	// does the policy.
	stop()
	if err := report(agentA, entry(a, "on-a"), entry(b, "ghost")); err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
		t.Errorf("node A's report with the webhook down: %v, want refused for the webhook", err)
	}
}
