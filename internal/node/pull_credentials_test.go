package node_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/controller"
	"github.com/zyvor/kairon/internal/controlplane"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/node/imagepull"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// TestPullCredentialsFromTheController runs a node agent as the chart
// does: as a ServiceAccount shared by all agents, with a token bound to
// its Pod on its node, and nothing granting that account any Secret. It
// pulls a private image with its Machine's pull secret, handed over by
// kairon-controller's endpoint; waits on a secret that is missing; and
// gives up on one of the wrong type.
func TestPullCredentialsFromTheController(t *testing.T) {
	host.SkipIfShort(t, "the control plane and a registry")
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Users: map[string]string{"kairon": "s3cret"}})
	digest := reg.Push(t, "private/app:1", testenv.BusyboxImage(t, v1.Config{}, nil))
	nodeName := ns + "-n"

	// The agents' account, with the agents' rules and no more.
	account := "kairon-node"
	saUser := "system:serviceaccount:" + ns + ":" + account
	env.Create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: account}})
	var rules []rbacv1.PolicyRule
	for _, file := range []string{"node-agent.yaml", "node-agent-register.yaml"} {
		r, err := controlplane.ReadRules(file)
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, r...)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-kairon-node"}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: account}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
	// The Node, as the kubelet would have made it, and the agent's Pod on it.
	env.Create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: account + "-pod"},
		Spec:       corev1.PodSpec{NodeName: nodeName, ServiceAccountName: account, Containers: []corev1.Container{{Name: "kairon-node", Image: "kairon"}}},
	}
	env.Create(t, pod)
	tr, err := kubernetes.NewForConfigOrDie(env.Config).CoreV1().ServiceAccounts(ns).CreateToken(ctx, account, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](3600),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A projected token file, as in the agent's Pod: read at each request.
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	agentConfig := &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerTokenFile: tokenFile, QPS: -1, Burst: -1}

	// kairon-controller with its webhook server, as the chart runs it.
	ca := newMigrationCA(t, "kairon webhook test CA")
	certDir := ca.dir(t, "localhost")
	port := freeLoopbackPort(t)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		WebhookServer:          webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: certDir}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := controller.SetupWithManager(mgr, controller.Options{Interval: time.Second, Webhook: true, NodeServiceAccount: saUser}); err != nil {
		t.Fatal(err)
	}
	testenv.RunInBackground(t, "controllers", mgr.Start)

	state := t.TempDir()
	backend, err := sim.New(sim.Options{StateDir: filepath.Join(state, "instances"), BootDelay: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	opts := node.Options{
		NodeName: nodeName, Backend: backend, StateDir: state, Interval: time.Second,
		CPU: 4, Memory: resource.MustParse("4Gi"),
		ListenAddress: "127.0.0.1:0", ClientCAFile: filepath.Join(env.DataDir, "pki", "ca.crt"),
		PullCredentialsURL:    fmt.Sprintf("https://localhost:%d%s", port, controller.PullCredentialsPath),
		PullCredentialsCAFile: filepath.Join(certDir, "ca.crt"),
	}
	withImageStore(t, t.TempDir())(&opts)
	agent, err := node.New(agentConfig, opts)
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunInBackground(t, "agent "+nodeName, agent.Run)

	// The account may not read the secret itself: only the endpoint gives it.
	auth := base64.StdEncoding.EncodeToString([]byte("kairon:s3cret"))
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "registry-credentials"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: fmt.Appendf(nil, `{"auths": {%q: {"auth": %q}}}`, reg.Addr, auth)}}
	ref := reg.Ref("private/app:1")
	waiting := imageMachine(t, env, ns, "waiting", nodeName, ref, secret.Name)
	testenv.Eventually(t, waitTimeout, "the Machine Pending on its missing secret", func() (bool, string) {
		got := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(waiting), got); err != nil {
			return false, err.Error()
		}
		reason, message := readyReason(got)
		return got.Status.Phase == kaironv1.MachinePending && reason == kaironv1.MachineReasonPullingImage &&
				strings.Contains(message, `spec.imagePullSecrets[0] "registry-credentials"`) && strings.Contains(message, "does not exist"),
			string(got.Status.Phase) + " " + reason + ": " + message
	})
	env.Create(t, secret)
	if _, err := kubernetes.NewForConfigOrDie(agentConfig).CoreV1().Secrets(ns).Get(ctx, secret.Name, metav1.GetOptions{}); err == nil {
		t.Fatal("the agents' account reads the pull secret itself: the test would not show the endpoint at work")
	}
	running := waitPhase(t, env, client.ObjectKeyFromObject(waiting), kaironv1.MachineRunning)
	if running.Status.ImageDigest != digest {
		t.Errorf("status.imageDigest %q, want %s", running.Status.ImageDigest, digest)
	}

	// Projected tokens rotate: the agent reads its token file at each
	// request. A token the API server does not take is refused and retried;
	// a fresh one in its place is used.
	second := reg.Push(t, "private/app:2", testenv.BusyboxImage(t, v1.Config{Env: []string{"V=2"}}, nil))
	if err := os.WriteFile(tokenFile, []byte("expired"), 0o600); err != nil {
		t.Fatal(err)
	}
	rotated := imageMachine(t, env, ns, "rotated", nodeName, reg.Ref("private/app:2"), secret.Name)
	testenv.Eventually(t, waitTimeout, "the Machine Pending on the refused token", func() (bool, string) {
		got := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(rotated), got); err != nil {
			return false, err.Error()
		}
		reason, message := readyReason(got)
		return got.Status.Phase == kaironv1.MachinePending && strings.Contains(message, "401"), string(got.Status.Phase) + " " + reason + ": " + message
	})
	if err := os.WriteFile(tokenFile, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := waitPhase(t, env, client.ObjectKeyFromObject(rotated), kaironv1.MachineRunning); got.Status.ImageDigest != second {
		t.Errorf("status.imageDigest %q after the token came back, want %s", got.Status.ImageDigest, second)
	}

	env.Create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "opaque"}, StringData: map[string]string{"password": "s3cret"}})
	m := waitFailed(t, env, client.ObjectKeyFromObject(imageMachine(t, env, ns, "opaque", nodeName, reg.Ref("private/other:1"), "opaque")))
	if reason, message := readyReason(m); reason != kaironv1.MachineReasonImagePullFailed || !strings.Contains(message, `spec.imagePullSecrets[0] "opaque" is of type "Opaque"`) {
		t.Errorf("with an Opaque secret: Ready %s %q", reason, message)
	}
}

// The client's answers: a refusal or an unreachable controller is retried
// (imagepull.TransientError).
func TestPullCredentialsClientRetriesWhatMayChange(t *testing.T) {
	cfg := &rest.Config{BearerToken: "t"}
	if _, err := node.NewPullCredentialsClient("http://controller/pull-credentials", "", cfg); err == nil {
		t.Error("a plain http URL is taken")
	}
	if _, err := node.NewPullCredentialsClient("https://controller/pull-credentials", "", &rest.Config{}); err == nil {
		t.Error("credentials without a bearer token are taken")
	}
	c, err := node.NewPullCredentialsClient(fmt.Sprintf("https://127.0.0.1:%d/pull-credentials", freeLoopbackPort(t)), "", cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Fetch(context.Background(), "ns", "m")
	var transient imagepull.TransientError
	if !errors.As(err, &transient) {
		t.Errorf("controller unreachable: %v, want a transient error", err)
	}
}

// freeLoopbackPort is a TCP port of 127.0.0.1 nothing listens on now.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
