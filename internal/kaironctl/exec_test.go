package kaironctl_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/kaironctl"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/guestsim"
)

const guestWait = time.Minute

// runGuestNode runs a real kairon-node whose backend is the sim backend
// with in-process guest agents (guestsim), registered on loopback so
// kaironctl reaches it directly with the caller's credentials.
func runGuestNode(t *testing.T, env *testenv.Env, nodeName string) *guestsim.Backend {
	t.Helper()
	return runGuestNodeOn(t, env, nodeName, "127.0.0.1:0")
}

// runGuestNodeOn is runGuestNode with the agent listening on listen.
func runGuestNodeOn(t *testing.T, env *testenv.Env, nodeName, listen string) *guestsim.Backend {
	t.Helper()
	stateDir := t.TempDir()
	b, err := sim.New(sim.Options{StateDir: filepath.Join(stateDir, "instances"), BootDelay: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	gb := guestsim.New(t, b)
	agent, err := node.New(env.Config, node.Options{
		NodeName: nodeName, Register: true, Backend: gb, StateDir: stateDir,
		CPU: 4, Memory: resource.MustParse("4Gi"),
		Network:       &node.NetworkOptions{CIDR: netip.MustParsePrefix("10.88.9.0/24"), NoLinks: true},
		ListenAddress: listen, Interval: time.Second,
		ClientCAFile: filepath.Join(env.DataDir, "pki", "ca.crt"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	})
	testenv.RunInBackground(t, "agent "+nodeName, agent.Run)
	return gb
}

// runningMachine creates a Machine on nodeName and waits until it runs.
func runningMachine(t *testing.T, env *testenv.Env, ns, name, nodeName string) {
	t.Helper()
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kaironv1.MachineSpec{NodeName: nodeName}}
	if err := env.Client.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, guestWait, "machine "+name+" running", func() (bool, string) {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(m), m); err != nil {
			return false, err.Error()
		}
		return m.Status.Phase == kaironv1.MachineRunning, string(m.Status.Phase)
	})
}

// kctlIO runs kaironctl with stdin and a stdout of its own.
func kctlIO(t *testing.T, kubeconfig string, stdin io.Reader, stdout io.Writer, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	code := kaironctl.MainIO(ctx, append([]string{"--kubeconfig", kubeconfig}, args...), stdin, stdout, &stderr)
	return stderr.String(), code
}

func randomFile(t *testing.T, path string, size int, seed uint64) string {
	t.Helper()
	data := make([]byte, size)
	r := rand.NewChaCha8([32]byte{byte(seed)})
	_, _ = r.Read(data)
	if err := os.WriteFile(path, data, 0o640); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// TestExecAndCpThroughTheNodeAgent drives kaironctl exec and cp against a
// real API server and a real node agent whose guests are in-process guest
// agents: echo, exit codes 0 and 3, 10 MB of stdout intact, stdin passed
// through, a 20 MB file copied in and out with its mode, claims named as
// mc/NAME, and clear errors naming the argument.
func TestExecAndCpThroughTheNodeAgent(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	runGuestNode(t, env, "exec-node")
	runningMachine(t, env, ns, "vm", "exec-node")
	kc := env.Kubeconfig
	exec := func(stdin io.Reader, args ...string) (string, string, int) {
		t.Helper()
		var out bytes.Buffer
		stderr, code := kctlIO(t, kc, stdin, &out, append([]string{"-n", ns}, args...)...)
		return out.String(), stderr, code
	}

	if out, stderr, code := exec(nil, "exec", "vm", "--", "echo", "hello", "guest"); out != "hello guest\n" || code != 0 || stderr != "" {
		t.Errorf("exec echo: %q %q exit %d", out, stderr, code)
	}
	if out, stderr, code := exec(nil, "exec", "machine/vm", "--", "sh", "-c", "echo out; echo err >&2; exit 3"); out != "out\n" || stderr != "err\n" || code != 3 {
		t.Errorf("exec exit 3: %q %q exit %d, want exit 3", out, stderr, code)
	}
	if _, stderr, code := exec(nil, "exec", "vm", "--", "true"); code != 0 || stderr != "" {
		t.Errorf("exec true: %q exit %d", stderr, code)
	}

	// Ctrl-C (the context ending) kills the command: exit 130.
	interrupt, cancel := context.WithCancel(ctx)
	defer cancel()
	var started lockedBuffer
	interrupted := make(chan int, 1)
	go func() {
		interrupted <- kaironctl.MainIO(interrupt, []string{"--kubeconfig", kc, "-n", ns, "exec", "vm", "--", "sh", "-c", "echo started; exec sleep 600"},
			strings.NewReader(""), &started, io.Discard)
	}()
	testenv.Eventually(t, guestWait, "the command started", func() (bool, string) {
		return started.String() == "started\n", started.String()
	})
	cancel()
	select {
	case code := <-interrupted:
		if code != 130 {
			t.Errorf("exec interrupted: exit %d, want 130", code)
		}
	case <-time.After(guestWait):
		t.Fatal("exec went on after the interrupt")
	}

	dir := t.TempDir()
	big := filepath.Join(dir, "big.bin")
	want := randomFile(t, big, 10<<20, 1)
	out, stderr, code := exec(nil, "exec", "vm", "--", "cat", big)
	if sum := sha256.Sum256([]byte(out)); hex.EncodeToString(sum[:]) != want || code != 0 {
		t.Errorf("10 MB of stdout: %d bytes, exit %d, %q; sha256 differs", len(out), code, stderr)
	}

	stdin := strings.Repeat("stdin line\n", 100000) // 1.1 MB
	if out, stderr, code := exec(strings.NewReader(stdin), "exec", "-i", "vm", "--", "sh", "-c", "cat; echo done"); out != stdin+"done\n" || code != 0 {
		t.Errorf("stdin passthrough: %d bytes back of %d, exit %d, %q", len(out), len(stdin)+5, code, stderr)
	}
	if out, _, code := exec(strings.NewReader("ignored"), "exec", "vm", "--", "sh", "-c", "cat; echo eof"); out != "eof\n" || code != 0 {
		t.Errorf("without -i the command's stdin is empty: %q exit %d", out, code)
	}

	// cp: 20 MB in and out, mode kept on the way in.
	src := filepath.Join(dir, "src.bin")
	want = randomFile(t, src, 20<<20, 2)
	guestPath := filepath.Join(dir, "in-guest.bin")
	if _, stderr, code := exec(nil, "cp", src, "vm:"+guestPath); code != 0 || stderr != "" {
		t.Fatalf("cp in: %q exit %d", stderr, code)
	}
	if got := testenv.FileSHA256(t, guestPath); got != want {
		t.Errorf("cp in: the guest's file differs")
	}
	if st, err := os.Stat(guestPath); err != nil || st.Mode().Perm() != 0o640 {
		t.Errorf("cp in: mode %v %v, want 0640", st.Mode().Perm(), err)
	}
	back := filepath.Join(dir, "back")
	if err := os.Mkdir(back, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := exec(nil, "cp", "vm:"+guestPath, back); code != 0 || stderr != "" {
		t.Fatalf("cp out: %q exit %d", stderr, code)
	}
	if got := testenv.FileSHA256(t, filepath.Join(back, "in-guest.bin")); got != want {
		t.Errorf("cp round trip of 20 MB: sha256 differs")
	}
	if out, stderr, code := exec(nil, "cp", "vm:"+filepath.Join(dir, "missing"), "-"); code != 1 || out != "" || !strings.Contains(stderr, "missing") {
		t.Errorf("cp of a missing file: %q %q exit %d, want exit 1 naming it", out, stderr, code)
	}
	if entries, _ := os.ReadDir(back); len(entries) != 1 {
		t.Errorf("a failed cp out left files behind: %v", entries)
	}

	// A claim names its bound Machine.
	claim := &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mine"}, Spec: kaironv1.MachineClaimSpec{PoolName: "pool"}}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := exec(nil, "exec", "mc/mine", "--", "true"); code != 1 || !strings.Contains(stderr, "MACHINE: machineclaim "+ns+"/mine is not bound to a Machine yet") {
		t.Errorf("exec on an unbound claim: %q exit %d", stderr, code)
	}
	claim.Status = kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimBound, MachineName: "vm"}
	if err := env.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if out, stderr, code := exec(nil, "exec", "mc/mine", "--", "sh", "-c", "echo via claim; exit 3"); out != "via claim\n" || code != 3 {
		t.Errorf("exec mc/mine: %q %q exit %d", out, stderr, code)
	}
	// The claim's bare name is no Machine's, and the error says how to
	// name it.
	if _, stderr, code := exec(nil, "exec", "mine", "--", "true"); code != 1 ||
		!strings.Contains(stderr, `MACHINE: machine "mine" not found in namespace "`+ns+`"; machineclaim "mine" is: name it mc/mine for the Machine bound to it`) {
		t.Errorf("exec with a claim's bare name: %q exit %d", stderr, code)
	}
	if _, stderr, code := exec(nil, "cp", src, "machineclaim/mine:"+guestPath+".2"); code != 0 || testenv.FileSHA256(t, guestPath+".2") != want {
		t.Errorf("cp to machineclaim/mine: %q exit %d", stderr, code)
	}

	// Clear errors, naming the argument.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "nope", "--", "true"}, `MACHINE: machine "nope" not found`},
		{[]string{"exec", "mc/nope", "--", "true"}, `MACHINE: machineclaim "nope" not found`},
		{[]string{"exec", "mp/pool", "--", "true"}, "machinepools are not Machines"},
		{[]string{"exec", "vm"}, "exec needs a COMMAND after --"},
		{[]string{"exec", "vm", "--", "/no/such/program"}, "exec in machine " + ns + "/vm"},
		{[]string{"cp", src, "nope:/tmp/x"}, `DST: machine "nope" not found`},
		{[]string{"cp", "nope:/tmp/x", dir}, `SRC: machine "nope" not found`},
		{[]string{"cp", src, "other"}, "cp needs MACHINE:/ABSOLUTE/PATH"},
		{[]string{"cp", "vm:/a", "vm:/b"}, "both name a Machine"},
		{[]string{"cp", filepath.Join(dir, "absent"), "vm:/tmp/x"}, "SRC: open"},
	} {
		_, stderr, code := exec(nil, c.args...)
		if code == 0 || !strings.Contains(stderr, c.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("kaironctl %s: %q exit %d, want one error line with %q", strings.Join(c.args, " "), stderr, code, c.want)
		}
	}
}

// TestExecForbiddenReachesNoGuest: a ServiceAccount that may read Machines
// and claims but not create machines/exec gets 403 from the node agent for
// exec and cp, and the guest sees nothing (no connection to a guest no
// one used, no new session on one in use); granted the role, it may.
func TestExecForbiddenReachesNoGuest(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	gb := runGuestNode(t, env, "exec-authz")
	runningMachine(t, env, ns, "used", "exec-authz")
	runningMachine(t, env, ns, "untouched", "exec-authz")
	if stderr, code := kctlIO(t, env.Kubeconfig, nil, io.Discard, "-n", ns, "exec", "used", "--", "true"); code != 0 {
		t.Fatalf("admin exec: %q exit %d", stderr, code)
	}
	used, untouched := gb.Guest(ns+"_used"), gb.Guest(ns+"_untouched")
	before := used.Requests()

	// A reader: Machines, claims and Nodes, nothing more.
	if err := env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reader"}}); err != nil {
		t.Fatal(err)
	}
	sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "reader"}
	bind(t, env, ns, "reader", []rbacv1.PolicyRule{{APIGroups: []string{kaironv1.GroupVersion.Group}, Resources: []string{"machines", "machineclaims"}, Verbs: []string{"get", "list"}}}, sa)
	nodeReader := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{GenerateName: "node-reader-"}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}}}
	if err := env.Client.Create(ctx, nodeReader); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), nodeReader) })
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{GenerateName: "node-reader-"}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: nodeReader.Name}, Subjects: []rbacv1.Subject{sa}}
	if err := env.Client.Create(ctx, crb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), crb) })
	kc := tokenKubeconfig(t, env, ns, "reader")

	for _, args := range [][]string{
		{"exec", "untouched", "--", "touch", "/tmp/should-not-exist"},
		{"exec", "used", "--", "true"},
		{"exec", "-i", "used", "--", "cat"},
		{"cp", "used:/etc/hostname", "-"},
		{"cp", "/etc/hostname", "untouched:/tmp/x"},
	} {
		stderr, code := kctlIO(t, kc, strings.NewReader("data"), io.Discard, append([]string{"-n", ns}, args...)...)
		if code != 1 || !strings.Contains(stderr, "node agent answered 403") || !strings.Contains(stderr, "create on machines/exec in namespace "+ns) {
			t.Errorf("kaironctl %s without machines/exec: %q exit %d, want 403", strings.Join(args, " "), stderr, code)
		}
	}
	if n := untouched.Requests(); n != 0 {
		t.Errorf("a refused exec reached the untouched guest: %d sessions", n)
	}
	if n := used.Requests() - before; n != 0 {
		t.Errorf("refused requests reached the used guest: %d sessions", n)
	}

	bind(t, env, ns, "exec", []rbacv1.PolicyRule{{APIGroups: []string{kaironv1.GroupVersion.Group}, Resources: []string{"machines/exec"}, Verbs: []string{"create"}}}, sa)
	// The agent reuses its denial for up to 10 seconds.
	testenv.Eventually(t, guestWait, "exec allowed once granted", func() (bool, string) {
		var out bytes.Buffer
		stderr, code := kctlIO(t, kc, nil, &out, "-n", ns, "exec", "untouched", "--", "echo", "granted")
		return code == 0 && out.String() == "granted\n", fmt.Sprintf("%q %q exit %d", out.String(), stderr, code)
	})
}

// bind grants rules in ns to subject.
func bind(t *testing.T, env *testenv.Env, ns, name string, rules []rbacv1.PolicyRule, subject rbacv1.Subject) {
	t.Helper()
	ctx := context.Background()
	if err := env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Rules: rules}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: []rbacv1.Subject{subject}}
	if err := env.Client.Create(ctx, rb); err != nil {
		t.Fatal(err)
	}
}

// tokenKubeconfig is a kubeconfig with a token of ServiceAccount ns/name.
func tokenKubeconfig(t *testing.T, env *testenv.Env, ns, name string) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: env.Config.Host, CertificateAuthorityData: env.Config.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: name, Namespace: ns}
	cfg.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// lockedBuffer is a buffer written by one goroutine and read by another.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestConsoleAttach: kaironctl console types into the serial console and
// shows what the guest answers; Ctrl-] leaves with exit 0. A second
// attach while one is open is refused.
func TestConsoleAttach(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	runGuestNode(t, env, "console-node")
	runningMachine(t, env, ns, "vm", "console-node")
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	var out lockedBuffer
	type ended struct {
		stderr string
		code   int
	}
	done := make(chan ended, 1)
	go func() {
		stderr, code := kctlIO(t, env.Kubeconfig, stdinR, &out, "-n", ns, "console", "vm")
		done <- ended{stderr, code}
	}()
	testenv.Eventually(t, guestWait, "the console's prompt", func() (bool, string) {
		return strings.Contains(out.String(), "guestsim login: "), out.String()
	})
	stderr, code := kctlIO(t, env.Kubeconfig, nil, io.Discard, "-n", ns, "console", "vm")
	if code != 1 || !strings.Contains(stderr, "attached by another session") {
		t.Errorf("a second attach: %q exit %d, want it refused", stderr, code)
	}
	if _, err := io.WriteString(stdinW, "hello guest\r"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, guestWait, "the console's answer", func() (bool, string) {
		return strings.Contains(out.String(), "echo: hello guest"), out.String()
	})
	if _, err := stdinW.Write([]byte{0x1d}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-done:
		if e.code != 0 || !strings.Contains(e.stderr, "Ctrl-]") || !strings.Contains(e.stderr, "Left the console") {
			t.Errorf("leaving with Ctrl-]: %q exit %d", e.stderr, e.code)
		}
	case <-time.After(guestWait):
		t.Fatal("Ctrl-] did not leave the console")
	}
}

// hostAddress is an IPv4 address of this host that is not loopback (the
// API server proxies only to such node addresses), or "".
func hostAddress() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	return ""
}

// TestExecThroughTheNodeProxy: with the node on a routable address,
// kaironctl goes through the API server's node proxy (POST
// /api/v1/nodes/https:NODE:/proxy/...), which passes the upgraded stream
// through. The node agent sees the API server's kubelet-client identity:
// 403 until that identity is granted create machines/exec (the chart's
// node.guestUser), then exec, stdin and cp work end to end.
func TestExecThroughTheNodeProxy(t *testing.T) {
	env := testenv.Get(t)
	ip := hostAddress()
	if ip == "" {
		t.Skip("this host has no non-loopback IPv4 address for the node proxy to reach")
	}
	if _, err := os.Stat(filepath.Join(env.DataDir, "pki", "apiserver-kubelet-client.crt")); err != nil {
		t.Skipf("the test API server has no kubelet-client certificate: %v", err)
	}
	ns := env.Namespace(t)
	// The API server dials a node by its Hostname address first, which is
	// the node's name: named after its address, it resolves without DNS.
	runGuestNodeOn(t, env, ip, net.JoinHostPort(ip, "0"))
	runningMachine(t, env, ns, "vm", ip)
	kc := env.Kubeconfig

	stderr, code := kctlIO(t, kc, nil, io.Discard, "-n", ns, "exec", "vm", "--", "true")
	if code != 1 || !strings.Contains(stderr, "403") || !strings.Contains(stderr, "create on machines/exec") {
		t.Errorf("through the proxy without a grant to its identity: %q exit %d, want 403", stderr, code)
	}
	proxy := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "kube-apiserver-kubelet-client"}
	bind(t, env, ns, "proxy-exec", []rbacv1.PolicyRule{{APIGroups: []string{kaironv1.GroupVersion.Group}, Resources: []string{"machines/exec"}, Verbs: []string{"create"}}}, proxy)
	testenv.Eventually(t, guestWait, "exec through the node proxy", func() (bool, string) {
		var out bytes.Buffer
		stderr, code := kctlIO(t, kc, nil, &out, "-n", ns, "exec", "vm", "--", "sh", "-c", "echo proxied; exit 3")
		return code == 3 && out.String() == "proxied\n", fmt.Sprintf("%q %q exit %d", out.String(), stderr, code)
	})
	in := strings.Repeat("x", 3<<20)
	var out bytes.Buffer
	if stderr, code := kctlIO(t, kc, strings.NewReader(in), &out, "-n", ns, "exec", "-i", "vm", "--", "cat"); out.String() != in || code != 0 {
		t.Errorf("3 MB of stdin and back through the proxy: %d bytes, %q exit %d", out.Len(), stderr, code)
	}
	dir := t.TempDir()
	want := randomFile(t, filepath.Join(dir, "f"), 5<<20, 3)
	if stderr, code := kctlIO(t, kc, nil, io.Discard, "-n", ns, "cp", filepath.Join(dir, "f"), "vm:"+filepath.Join(dir, "g")); code != 0 || testenv.FileSHA256(t, filepath.Join(dir, "g")) != want {
		t.Errorf("cp through the proxy: %q exit %d", stderr, code)
	}
}

// TestExecImpersonationReachesTheAgent (issue 42): kaironctl --as and
// --as-group reach the node agent, which authorizes the session as the
// impersonated user, not as the credential (an admin, who may exec
// anything): exec, cp and console as a tenant without the permission are
// refused; granted, the tenant's exec runs; a group's grant counts for
// --as-group.
func TestExecImpersonationReachesTheAgent(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	gb := runGuestNode(t, env, "exec-imp")
	runningMachine(t, env, ns, "vm", "exec-imp")
	tenant, grouped := "tenant-a-"+ns, "tenant-b-"+ns
	user := func(name string) rbacv1.Subject {
		return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
	}
	// Both tenants may find the Machine and its Node, nothing more.
	bind(t, env, ns, "reader", []rbacv1.PolicyRule{{APIGroups: []string{kaironv1.GroupVersion.Group}, Resources: []string{"machines", "machineclaims"}, Verbs: []string{"get", "list"}}}, user(tenant))
	rb := &rbacv1.RoleBinding{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "reader"}, rb); err != nil {
		t.Fatal(err)
	}
	rb.Subjects = append(rb.Subjects, user(grouped))
	if err := env.Client.Update(ctx, rb); err != nil {
		t.Fatal(err)
	}
	nodeReader := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{GenerateName: "node-reader-"}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}}}
	if err := env.Client.Create(ctx, nodeReader); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), nodeReader) })
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{GenerateName: "node-reader-"}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: nodeReader.Name}, Subjects: []rbacv1.Subject{user(tenant), user(grouped)}}
	if err := env.Client.Create(ctx, crb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), crb) })
	guest := gb.Guest(ns + "_vm")

	// (1) The admin as a tenant without create machines/exec: refused by
	// the agent, for exec, cp and console alike, and nothing reaches the
	// guest.
	for _, c := range []struct {
		args  []string
		needs string
	}{
		{[]string{"exec", "vm", "--", "touch", "/tmp/should-not-exist"}, "create on machines/exec"},
		{[]string{"cp", "vm:/etc/hostname", "-"}, "create on machines/exec"},
		{[]string{"cp", "/etc/hostname", "vm:/tmp/x"}, "create on machines/exec"},
		{[]string{"console", "vm"}, "create on machines/console"},
	} {
		stderr, code := kctlIO(t, env.Kubeconfig, strings.NewReader(""), io.Discard, append([]string{"-n", ns, "--as", tenant}, c.args...)...)
		if code != 1 || !strings.Contains(stderr, "node agent answered 403") || !strings.Contains(stderr, c.needs+" in namespace "+ns+" for user "+tenant+" (--as)") {
			t.Errorf("kaironctl --as %s %s: %q exit %d, want the agent's 403 for the tenant", tenant, strings.Join(c.args, " "), stderr, code)
		}
	}
	if n := guest.Requests(); n != 0 {
		t.Errorf("the tenant's refused sessions reached the guest: %d", n)
	}

	// (2) Granted, the tenant's exec runs.
	bind(t, env, ns, "exec", []rbacv1.PolicyRule{{APIGroups: []string{kaironv1.GroupVersion.Group}, Resources: []string{"machines/exec"}, Verbs: []string{"create"}}}, user(tenant))
	testenv.Eventually(t, guestWait, "the tenant's exec once granted", func() (bool, string) {
		var out bytes.Buffer
		stderr, code := kctlIO(t, env.Kubeconfig, nil, &out, "-n", ns, "--as", tenant, "exec", "vm", "--", "echo", "as tenant")
		return code == 0 && out.String() == "as tenant\n", fmt.Sprintf("%q %q exit %d", out.String(), stderr, code)
	})

	// --as-group: the group's grant counts, and only with the group.
	group := "execs-" + ns
	if stderr, code := kctlIO(t, env.Kubeconfig, nil, io.Discard, "-n", ns, "--as", grouped, "exec", "vm", "--", "true"); code != 1 || !strings.Contains(stderr, "403") {
		t.Errorf("--as %s without the group: %q exit %d, want 403", grouped, stderr, code)
	}
	bind(t, env, ns, "group-exec", []rbacv1.PolicyRule{{APIGroups: []string{kaironv1.GroupVersion.Group}, Resources: []string{"machines/exec"}, Verbs: []string{"create"}}},
		rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: group})
	testenv.Eventually(t, guestWait, "exec as a member of the granted group", func() (bool, string) {
		var out bytes.Buffer
		stderr, code := kctlIO(t, env.Kubeconfig, nil, &out, "-n", ns, "--as", grouped, "--as-group", group, "--as-group", "system:authenticated", "exec", "vm", "--", "echo", "grouped")
		return code == 0 && out.String() == "grouped\n", fmt.Sprintf("%q %q exit %d", out.String(), stderr, code)
	})
}
