package kaironctl_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// agentIP is where the fake agent listens. Tests only use loopback; the API
// server will not proxy to loopback node addresses, so these tests exercise
// kaironctl's direct path for nodes on this host (as in kairon-local).
func agentIP(t *testing.T) net.IP {
	t.Helper()
	return net.IPv4(127, 0, 0, 1)
}

// fakeAgent serves consoles the way kairon-node does, over HTTPS with a
// certificate the API server does not verify (as with kubelets).
type fakeAgent struct {
	mu       sync.Mutex
	requests []*url.URL
	console  string
	// With follow=true the agent sends "first\n", waits for proceed, then
	// sends "second\n" and ends the response.
	proceed chan struct{}
}

func (a *fakeAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.requests = append(a.requests, r.URL)
	a.mu.Unlock()
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if len(parts) != 5 || parts[0] != "v1" || parts[1] != "machines" || parts[4] != "console" {
		http.NotFound(w, r)
		return
	}
	if parts[3] == "unknown" {
		http.Error(w, "no console for machine "+parts[2]+"/"+parts[3], http.StatusNotFound)
		return
	}
	if parts[3] == "secret" { // as the agent answers a caller RBAC does not let read it
		http.Error(w, "Forbidden", http.StatusForbidden)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if r.URL.Query().Get("follow") == "true" {
		fmt.Fprint(w, "first\n")
		w.(http.Flusher).Flush()
		select {
		case <-a.proceed:
		case <-r.Context().Done():
			return
		case <-time.After(time.Minute):
			return
		}
		fmt.Fprint(w, "second\n")
		return
	}
	lines := strings.SplitAfter(a.console, "\n")
	lines = lines[:len(lines)-1] // after the last newline
	if tail := r.URL.Query().Get("tail"); tail != "" {
		n, _ := strconv.Atoi(tail)
		if n < len(lines) {
			lines = lines[len(lines)-n:]
		}
	}
	fmt.Fprint(w, strings.Join(lines, ""))
}

func (a *fakeAgent) lastRequest() *url.URL {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.requests) == 0 {
		return nil
	}
	return a.requests[len(a.requests)-1]
}

// startAgent runs a fake agent and registers it as a Kairon Node.
func startAgent(t *testing.T, env *testenv.Env, nodeName string) *fakeAgent {
	t.Helper()
	ip := agentIP(t)
	agent := &fakeAgent{console: "line 1\nline 2\nline 3\n", proceed: make(chan struct{})}
	srv := httptest.NewUnstartedServer(agent)
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	srv.StartTLS()
	t.Cleanup(srv.Close)

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{
		kaironv1.LabelNode: "", kaironv1.LabelNodeBackend: "qemu", kaironv1.LabelNodeAcceleration: "tcg",
	}}}
	env.Create(t, node)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), node) })
	node.Status = corev1.NodeStatus{
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(ln.Addr().(*net.TCPAddr).Port)}},
		Conditions:      []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
	}
	env.SetStatus(t, node)
	return agent
}

func TestLogs(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	nodeName := ns + "-agent"
	agent := startAgent(t, env, nodeName)
	machine(t, env, ns, "vm", nodeName, 1, "256Mi", kaironv1.MachineRunning)
	machine(t, env, ns, "unknown", nodeName, 1, "256Mi", kaironv1.MachineRunning)
	machine(t, env, ns, "secret", nodeName, 1, "256Mi", kaironv1.MachineRunning)
	machine(t, env, ns, "waiting", "", 1, "256Mi", kaironv1.MachinePending)
	machine(t, env, ns, "fresh", "", 1, "256Mi", "")
	consolePath := "/v1/machines/" + ns + "/vm/console"

	t.Run("tail", func(t *testing.T) {
		r := kctl(t, env, "logs", "machine", "vm", "-n", ns, "--tail", "2").ok(t)
		if r.stdout != "line 2\nline 3\n" {
			t.Errorf("stdout %q", r.stdout)
		}
		req := agent.lastRequest()
		if req == nil || req.Path != consolePath || req.Query().Get("tail") != "2" || req.Query().Has("follow") {
			t.Errorf("agent got %v, want %s?tail=2", req, consolePath)
		}
	})

	t.Run("a claim's Machine", func(t *testing.T) {
		c := &kaironv1.MachineClaim{ObjectMeta: meta(ns, "job"), Spec: kaironv1.MachineClaimSpec{PoolName: "agents"}}
		env.Create(t, c)
		c.Status = kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimBound, MachineName: "vm"}
		env.SetStatus(t, c)
		for _, args := range [][]string{{"mc/job"}, {"machineclaim", "job"}} {
			r := kctl(t, env, append(append([]string{"logs"}, args...), "-n", ns, "--tail", "1")...).ok(t)
			if r.stdout != "line 3\n" {
				t.Errorf("logs %v: stdout %q", args, r.stdout)
			}
			if req := agent.lastRequest(); req == nil || req.Path != consolePath {
				t.Errorf("logs %v: agent got %v, want %s", args, req, consolePath)
			}
		}
	})

	t.Run("whole console", func(t *testing.T) {
		r := kctl(t, env, "logs", "vm", "-n", ns).ok(t)
		if r.stdout != "line 1\nline 2\nline 3\n" {
			t.Errorf("stdout %q", r.stdout)
		}
		if req := agent.lastRequest(); req.Query().Has("tail") {
			t.Errorf("agent got %v, want no tail", req)
		}
	})

	t.Run("follow streams", func(t *testing.T) {
		out := &syncBuffer{want: "first\n", seen: make(chan struct{})}
		done := make(chan result, 1)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		go func() {
			done <- kctlContext(ctx, env.Kubeconfig, out, "logs", "mach", "vm", "-n", ns, "-f", "--tail", "0")
		}()
		// "first" must arrive while the agent still holds the response open.
		select {
		case <-out.seen:
		case r := <-done:
			t.Fatalf("logs -f ended before streaming: %+v", r)
		case <-time.After(30 * time.Second):
			t.Fatalf("first line not streamed; stdout so far %q", out.String())
		}
		close(agent.proceed)
		r := <-done
		r.ok(t)
		if r.stdout != "first\nsecond\n" {
			t.Errorf("stdout %q", r.stdout)
		}
		req := agent.lastRequest()
		if req.Query().Get("follow") != "true" || req.Query().Get("tail") != "0" {
			t.Errorf("agent got %v, want follow=true&tail=0", req)
		}
	})

	t.Run("errors", func(t *testing.T) {
		kctl(t, env, "logs", "machine", "waiting", "-n", ns).failed(t, "machine "+ns+"/waiting has no node yet (phase Pending)")
		kctl(t, env, "logs", "machine", "fresh", "-n", ns).failed(t, "machine "+ns+"/fresh has no node yet (phase Pending)")
		r := kctl(t, env, "logs", "machine", "unknown", "-n", ns)
		r.failed(t, "machine "+ns+"/unknown", nodeName, "node agent answered 404: no console for machine "+ns+"/unknown")
		kctl(t, env, "logs", "machine", "secret", "-n", ns).failed(t, "node agent answered 403: Forbidden", "needs get on machines/console in namespace "+ns)
	})
}
