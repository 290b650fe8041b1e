package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

func TestNodeOfUser(t *testing.T) {
	const sa = "system:serviceaccount:kairon:kairon-node"
	for _, tc := range []struct {
		name string
		user authenticationv1.UserInfo
		sa   string
		want string
	}{
		{"kairon-local user", authenticationv1.UserInfo{Username: "kairon:node:n1"}, sa, "n1"},
		{"kairon-local user, no service account", authenticationv1.UserInfo{Username: "kairon:node:n1"}, "", "n1"},
		{"pod-bound token", authenticationv1.UserInfo{Username: sa, Extra: map[string]authenticationv1.ExtraValue{NodeNameExtra: {"n2"}}}, sa, "n2"},
		{"token bound to no pod", authenticationv1.UserInfo{Username: sa}, sa, ""},
		{"two node names", authenticationv1.UserInfo{Username: sa, Extra: map[string]authenticationv1.ExtraValue{NodeNameExtra: {"n1", "n2"}}}, sa, ""},
		{"another service account on a node", authenticationv1.UserInfo{Username: "system:serviceaccount:kairon:other", Extra: map[string]authenticationv1.ExtraValue{NodeNameExtra: {"n1"}}}, sa, ""},
		{"no node service account configured", authenticationv1.UserInfo{Username: sa, Extra: map[string]authenticationv1.ExtraValue{NodeNameExtra: {"n1"}}}, "", ""},
		{"admin", authenticationv1.UserInfo{Username: "admin", Groups: []string{"system:masters"}}, sa, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NodeOfUser(tc.user, tc.sa); got != tc.want {
				t.Errorf("NodeOfUser(%+v, %q) = %q, want %q", tc.user, tc.sa, got, tc.want)
			}
		})
	}
}

// pullCredentialsAnswer is one answer of the endpoint.
type pullCredentialsAnswer struct {
	code    int
	body    string
	configs [][]byte
}

// askPullCredentials calls the endpoint at base as token.
func askPullCredentials(t *testing.T, base string, caPEM []byte, token, ns, machine string) pullCredentialsAnswer {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, base+PullCredentialsPath+"?"+url.Values{"namespace": {ns}, "machine": {machine}}.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := pullCredentialsAnswer{code: resp.StatusCode, body: string(body)}
	if resp.StatusCode == http.StatusOK {
		var pc PullCredentials
		if err := json.Unmarshal(body, &pc); err != nil {
			t.Fatalf("answer %s: %v", body, err)
		}
		a.configs = pc.DockerConfigs
	}
	return a
}

// nodeAgentTokens makes the tokens of a ServiceAccount shared by node
// agents, as the chart's DaemonSet has them: bound to a Pod on each of
// nodes (which must exist), and one bound to no Pod.
func nodeAgentTokens(t *testing.T, env *testenv.Env, ns, account string, nodes ...string) (bound map[string]string, unbound string) {
	t.Helper()
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(env.Config)
	env.Create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: account}})
	bound = map[string]string{}
	for _, n := range nodes {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: account + "-" + n},
			Spec:       corev1.PodSpec{NodeName: n, ServiceAccountName: account, Containers: []corev1.Container{{Name: "kairon-node", Image: "kairon"}}},
		}
		env.Create(t, pod)
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, account, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		bound[n] = tr.Status.Token
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, account, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](3600),
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return bound, tr.Status.Token
}

// Node agents sharing one ServiceAccount get from kairon-controller the
// pull secrets of the Machines placed on their node, or migrating to it,
// and nothing else; the controller runs with its own RBAC rules
// (config/rbac/controller.yaml), so it must be allowed its token reviews.
func TestPullCredentialsEndpoint(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	ctx := context.Background()
	cfg := withControllerRules(t, env, ns)
	certDir, caPEM := writeServingCert(t)
	port := freePort(t)
	account := "kairon-node"
	saUser := "system:serviceaccount:" + ns + ":" + account
	env.StartManager(t, cfg, ctrl.Options{
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		Controller:             testControllerConfig(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: certDir}),
	}, func(mgr ctrl.Manager) error {
		return SetupWithManager(mgr, Options{Interval: testInterval, Webhook: true, NodeServiceAccount: saUser})
	})
	base := fmt.Sprintf("https://127.0.0.1:%d", port)

	nodeA, nodeB := createNode(t, env, ns, "a", 4, "4Gi").Name, createNode(t, env, ns, "b", 4, "4Gi").Name
	tokens, unbound := nodeAgentTokens(t, env, ns, account, nodeA, nodeB)
	otherTokens, _ := nodeAgentTokens(t, env, ns, "not-kairon", nodeA)
	pullSecret(t, env, ns, "pull-a", "registry.example", "ua", "pw-secret-a")
	pullSecret(t, env, ns, "pull-a2", "registry.example", "ua2", "pw-secret-a2")
	pullSecret(t, env, ns, "pull-b", "registry.example", "ub", "pw-secret-b")
	env.Create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "opaque"}, StringData: map[string]string{"password": "pw-secret-opaque"}})
	want := func(name string) []byte {
		s := &corev1.Secret{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
			t.Fatal(err)
		}
		return s.Data[corev1.DockerConfigJsonKey]
	}
	const image = "registry.example/team/app:1"
	machine := func(name, node string, secrets ...string) *kaironv1.Machine {
		return createMachine(t, env, ns, name, 1, "64Mi", func(m *kaironv1.Machine) {
			m.Spec.NodeName, m.Spec.Image = node, image
			for _, s := range secrets {
				m.Spec.ImagePullSecrets = append(m.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
			}
		})
	}
	ma := machine("ma", nodeA, "pull-a", "pull-a2")
	machine("mb", nodeB, "pull-b")
	machine("missing", nodeA, "pull-a", "not-yet")
	machine("wrong-type", nodeA, "opaque")

	// The webhook server may take a moment to listen.
	var got pullCredentialsAnswer
	eventually(t, "node a's agent to get its machine's secrets", func() (bool, string) {
		got = askPullCredentials(t, base, caPEM, tokens[nodeA], ns, "ma")
		return got.code == http.StatusOK, fmt.Sprint(got.code, " ", got.body)
	})
	if len(got.configs) != 2 || string(got.configs[0]) != string(want("pull-a")) || string(got.configs[1]) != string(want("pull-a2")) {
		t.Errorf("node a's configs for ma: %q", got.configs)
	}

	refused := func(who, token, machine string, code int, says string) {
		t.Helper()
		got := askPullCredentials(t, base, caPEM, token, ns, machine)
		if got.code != code || !strings.Contains(got.body, says) || got.configs != nil {
			t.Errorf("%s asking for %s: %d %q, want %d and %q", who, machine, got.code, got.body, code, says)
		}
		if strings.Contains(got.body, "pw-secret") {
			t.Errorf("%s asking for %s: the refusal shows secret data: %q", who, machine, got.body)
		}
	}
	refused("node a", tokens[nodeA], "mb", http.StatusForbidden, "node agent of "+nodeA+" may not read the pull secrets of machine "+ns+"/mb")
	refused("node b", tokens[nodeB], "ma", http.StatusForbidden, "may not read")
	refused("a token bound to no pod", unbound, "ma", http.StatusForbidden, "user "+saUser+" is not a node agent")
	refused("another account on node a", otherTokens[nodeA], "ma", http.StatusForbidden, "is not a node agent")
	refused("no token", "", "ma", http.StatusUnauthorized, "bearer token")
	refused("a forged token", "forged", "ma", http.StatusUnauthorized, "not valid")
	refused("node a", tokens[nodeA], "gone", http.StatusNotFound, "does not exist")
	refused("node a", tokens[nodeA], "missing", http.StatusNotFound, `spec.imagePullSecrets[1] "not-yet"`)
	refused("node a", tokens[nodeA], "wrong-type", http.StatusUnprocessableEntity, `spec.imagePullSecrets[0] "opaque" is of type "Opaque"`)

	// The migration's target gets them while it is named, and no longer.
	patchMachine(t, env, ma, map[string]any{"metadata": map[string]any{"annotations": map[string]any{kaironv1.AnnotationMachineMigrationTarget: nodeB}}})
	if got := askPullCredentials(t, base, caPEM, tokens[nodeB], ns, "ma"); got.code != http.StatusOK || len(got.configs) != 2 {
		t.Errorf("node b, ma's migration target: %d %q", got.code, got.body)
	}
	patchMachine(t, env, ma, map[string]any{"metadata": map[string]any{"annotations": map[string]any{kaironv1.AnnotationMachineMigrationTarget: nil}}})
	refused("node b, no longer the target", tokens[nodeB], "ma", http.StatusForbidden, "may not read")
}
