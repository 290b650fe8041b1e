package node_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
)

// grantConsole lets subject get machines/console in namespace ns.
func grantConsole(t *testing.T, env *testenv.Env, ns string, subject rbacv1.Subject) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "console-reader-"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{kaironv1.GroupVersion.Group}, Resources: []string{"machines/console"}, Verbs: []string{"get"}}},
	}
	if err := env.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "console-reader-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{subject},
	}
	if err := env.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
}

// consoleAddress is where the agent of nodeName serves consoles.
func consoleAddress(t *testing.T, env *testenv.Env, nodeName string) string {
	t.Helper()
	var address string
	testenv.Eventually(t, waitTimeout, "node "+nodeName+"'s console endpoint", func() (bool, string) {
		n := &corev1.Node{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: nodeName}, n); err != nil {
			return false, err.Error()
		}
		port := n.Status.DaemonEndpoints.KubeletEndpoint.Port
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP && port > 0 {
				address = net.JoinHostPort(a.Address, strconv.Itoa(int(port)))
				return true, ""
			}
		}
		return false, "no address yet"
	})
	return address
}

// TestConsoleAuthorizesEachRequest plays console readers against a real
// agent: a certificate of the client CA is not enough any more; the holder
// needs get machines/console in the Machine's namespace (a
// SubjectAccessReview per request). Bearer tokens are checked with a
// TokenReview. No credentials get 401, a traversal 400, and the console
// port no longer serves migration states.
func TestConsoleAuthorizesEachRequest(t *testing.T) {
	env := testenv.Get(t)
	ns, other := env.Namespace(t), env.Namespace(t)
	ctx := context.Background()
	ca := newMigrationCA(t, "console client CA")
	caFile := filepath.Join(ca.dir(t, "unused"), "ca.crt")
	runSimAgent(t, env, "con-authz", t.TempDir(), nil, func(o *node.Options) { o.ClientCAFile = caFile })
	for _, namespace := range []string{ns, other} {
		m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "vm"}, Spec: kaironv1.MachineSpec{NodeName: "con-authz"}}
		if err := env.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	}
	grantConsole(t, env, ns, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"})
	grantConsole(t, env, ns, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "reader"})
	if err := env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reader"}}); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "reader", &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	address := consoleAddress(t, env, "con-authz")

	get := func(config *tls.Config, token, path string) (int, string) {
		t.Helper()
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: config}, Timeout: 10 * time.Second}
		req, err := http.NewRequest(http.MethodGet, "https://"+address+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(body)
	}
	console := func(namespace string) string { return fmt.Sprintf("/v1/machines/%s/vm/console?tail=1", namespace) }
	alice, bob := ca.tlsClient(t, "alice"), ca.tlsClient(t, "bob")
	nobody := ca.tlsClient(t, "")

	for _, c := range []struct {
		who    string
		config *tls.Config
		token  string
		path   string
		code   int
	}{
		{"alice in her namespace", alice, "", console(ns), http.StatusOK},
		{"the service account with its token", nobody, tr.Status.Token, console(ns), http.StatusOK},
		{"alice in another namespace", alice, "", console(other), http.StatusForbidden},
		{"bob, a certificate holder without the permission", bob, "", console(ns), http.StatusForbidden},
		{"the service account in another namespace", nobody, tr.Status.Token, console(other), http.StatusForbidden},
		{"no credentials", nobody, "", console(ns), http.StatusUnauthorized},
		{"a forged token", nobody, "not-a-token", console(ns), http.StatusUnauthorized},
		{"alice traversing", alice, "", "/v1/machines/" + ns + "/..%2F..%2Fvm/console", http.StatusBadRequest},
		{"alice asking the console port for a saved state", alice, "", "/v1/migrations/" + ns + "/move/state", http.StatusNotFound},
	} {
		code, body := get(c.config, c.token, c.path)
		if code != c.code {
			t.Errorf("%s: %d %q, want %d", c.who, code, body, c.code)
		}
		if code == http.StatusOK && body != "KAIRON-READY\n" {
			t.Errorf("%s: body %q, want the console's last line", c.who, body)
		}
		if code != http.StatusOK && len(body) > 64 {
			t.Errorf("%s: refusal %q is not terse", c.who, body)
		}
	}
	// Alice's name on a certificate of another CA: refused in the
	// handshake, or (a client that does not offer a certificate the server
	// did not ask for) taken as no credentials.
	if code, body := get(newMigrationCA(t, "intruder CA").tlsClient(t, "alice"), "", console(ns)); code != 0 && code != http.StatusUnauthorized {
		t.Errorf("alice's name on another CA's certificate: %d %q, want the handshake refused or 401", code, body)
	}
}

// TestConsoleServesTheNodeProxyIdentity: the API server's node proxy
// presents its kubelet-client certificate (kube-apiserver
// --kubelet-client-certificate). The test presents that certificate itself
// (the API server will not proxy to a loopback node): the console is
// refused until RBAC grants that user get machines/console, as the chart
// and kairon-local do, and served afterwards.
func TestConsoleServesTheNodeProxyIdentity(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	proxyCert, err := tls.LoadX509KeyPair(filepath.Join(env.DataDir, "pki", "apiserver-kubelet-client.crt"), filepath.Join(env.DataDir, "pki", "apiserver-kubelet-client.key"))
	if err != nil {
		t.Skipf("the test API server has no kubelet-client certificate: %v", err)
	}
	runSimAgent(t, env, "con-proxy", t.TempDir(), nil) // --client-ca-file: the cluster CA
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}, Spec: kaironv1.MachineSpec{NodeName: "con-proxy"}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	url := "https://" + consoleAddress(t, env, "con-proxy") + fmt.Sprintf("/v1/machines/%s/vm/console?tail=1", ns)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{proxyCert}},
	}}
	get := func() (int, string) {
		t.Helper()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(body)
	}
	if code, body := get(); code != http.StatusForbidden {
		t.Errorf("the node proxy's identity without RBAC: %d %q, want 403", code, body)
	}
	grantConsole(t, env, ns, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "kube-apiserver-kubelet-client"})
	// The agent reuses its denial for a few seconds.
	testenv.Eventually(t, waitTimeout, "the node proxy's identity let in", func() (bool, string) {
		code, body := get()
		return code == http.StatusOK && body == "KAIRON-READY\n", fmt.Sprintf("%d %q", code, body)
	})
}

// grantClusterRule gives subject rule cluster-wide, until the test ends.
func grantClusterRule(t *testing.T, env *testenv.Env, rule rbacv1.PolicyRule, subject rbacv1.Subject) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{GenerateName: "console-test-"}, Rules: []rbacv1.PolicyRule{rule}}
	if err := env.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), role) })
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "console-test-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{subject},
	}
	if err := env.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), binding) })
}

// TestConsoleImpersonation (issue 42) plays impersonation against a real
// agent and RBAC: the agent asks the API server whether the certificate
// holder may impersonate the user its Impersonate-User header names, then
// authorizes the console read as that user. Carol may impersonate alice
// only and may not read the console; admin-like dave may read it and
// impersonate anyone; alice may read it. Without the agent's check, dave
// as carol would read it as dave.
func TestConsoleImpersonation(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	ca := newMigrationCA(t, "console client CA")
	caFile := filepath.Join(ca.dir(t, "unused"), "ca.crt")
	runSimAgent(t, env, "con-imp", t.TempDir(), nil, func(o *node.Options) { o.ClientCAFile = caFile })
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}, Spec: kaironv1.MachineSpec{NodeName: "con-imp"}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	user := func(name string) rbacv1.Subject {
		return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
	}
	alice, carol, dave := "imp-alice-"+ns, "imp-carol-"+ns, "imp-dave-"+ns
	grantConsole(t, env, ns, user(alice))
	grantConsole(t, env, ns, user(dave))
	grantClusterRule(t, env, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"users"}, Verbs: []string{"impersonate"}, ResourceNames: []string{alice}}, user(carol))
	grantClusterRule(t, env, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"users", "groups"}, Verbs: []string{"impersonate"}}, user(dave))
	address := consoleAddress(t, env, "con-imp")
	url := "https://" + address + fmt.Sprintf("/v1/machines/%s/vm/console?tail=1", ns)
	get := func(as, impersonate string, groups ...string) (int, string) {
		t.Helper()
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: ca.tlsClient(t, as)}, Timeout: 10 * time.Second}
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(authnv1.ImpersonateUserHeader, impersonate)
		for _, g := range groups {
			req.Header.Add(authnv1.ImpersonateGroupHeader, g)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(body)
	}
	for _, c := range []struct {
		who, as, impersonate string
		groups               []string
		code                 int
		body                 string
	}{
		{"bob, who may impersonate no one, as alice", "imp-bob", alice, nil, http.StatusForbidden, `may not impersonate users "` + alice + `"`},
		{"carol as alice, who may read it", carol, alice, nil, http.StatusOK, "KAIRON-READY\n"},
		{"carol as someone she may not impersonate", carol, dave, nil, http.StatusForbidden, `user "` + carol + `" may not impersonate users "` + dave + `"`},
		{"carol as alice in a group she may not impersonate", carol, alice, []string{"system:masters"}, http.StatusForbidden, `may not impersonate groups "system:masters"`},
		{"dave, who may impersonate anyone, as carol, who may not read it", dave, carol, nil, http.StatusForbidden, "Forbidden"},
		{"dave as alice", dave, alice, nil, http.StatusOK, "KAIRON-READY\n"},
	} {
		code, body := get(c.as, c.impersonate, c.groups...)
		if code != c.code || !strings.Contains(body, c.body) {
			t.Errorf("%s: %d %q, want %d %q", c.who, code, body, c.code, c.body)
		}
	}
}
