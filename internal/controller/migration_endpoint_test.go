package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

func TestMigrationEndpointFor(t *testing.T) {
	internal := func(ip string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}
	}
	for _, c := range []struct {
		name      string
		port      string
		addresses []corev1.NodeAddress
		want      string
	}{
		{"port and InternalIP", "10251", []corev1.NodeAddress{internal("10.0.0.7")}, "10.0.0.7:10251"},
		{"first InternalIP", "10251", []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "n1"}, internal("10.0.0.7"), internal("10.0.0.8")}, "10.0.0.7:10251"},
		{"IPv6", "10251", []corev1.NodeAddress{internal("fd00::7")}, "[fd00::7]:10251"},
		{"loopback (kairon-local)", "40123", []corev1.NodeAddress{internal("127.0.0.1")}, "127.0.0.1:40123"},
		{"no port", "", []corev1.NodeAddress{internal("10.0.0.7")}, ""},
		{"port 0", "0", []corev1.NodeAddress{internal("10.0.0.7")}, ""},
		{"port out of range", "70000", []corev1.NodeAddress{internal("10.0.0.7")}, ""},
		// An agent that writes a host into its port must not smuggle it
		// into the endpoint.
		{"host in the port", "6.6.6.6:10251", []corev1.NodeAddress{internal("10.0.0.7")}, ""},
		{"negative port", "-1", []corev1.NodeAddress{internal("10.0.0.7")}, ""},
		{"no InternalIP", "10251", []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: "1.2.3.4"}}, ""},
		{"InternalIP a name", "10251", []corev1.NodeAddress{internal("evil.example")}, ""},
		{"InternalIP unspecified", "10251", []corev1.NodeAddress{internal("0.0.0.0")}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{kaironv1.AnnotationNodeMigrationPort: c.port}},
				Status:     corev1.NodeStatus{Addresses: c.addresses},
			}
			if got := MigrationEndpointFor(n); got != c.want {
				t.Errorf("endpoint %q, want %q", got, c.want)
			}
		})
	}
}

// TestMigrationEndpointIsTheControllers: the controller writes the endpoint
// from the Node's InternalIP and the agent's port, puts it back when
// someone (a compromised agent) rewrites it to another host, follows a new
// port, and removes it when the port goes.
func TestMigrationEndpointIsTheControllers(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	node := createNode(t, env, ns, "endpoint", 4, "4Gi", func(n *corev1.Node) {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.7"}}
		n.Annotations = map[string]string{kaironv1.AnnotationNodeMigrationPort: "10251"}
	})
	startControllers(t, env, ns, Options{})
	key := client.ObjectKeyFromObject(node)
	waitEndpoint := func(what, want string) {
		t.Helper()
		eventually(t, what, func() (bool, string) {
			n := &corev1.Node{}
			if err := env.Client.Get(ctx, key, n); err != nil {
				return false, err.Error()
			}
			got, has := n.Annotations[kaironv1.AnnotationNodeMigrationEndpoint]
			if want == "" {
				return !has, "endpoint " + got
			}
			return got == want, "endpoint " + got
		})
	}
	setAnnotation := func(name, value string) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n := &corev1.Node{}
			if err := env.Client.Get(ctx, key, n); err != nil {
				return err
			}
			if value == "" {
				delete(n.Annotations, name)
			} else {
				n.Annotations[name] = value
			}
			return env.Client.Update(ctx, n)
		}); err != nil {
			t.Fatal(err)
		}
	}
	waitEndpoint("the endpoint from InternalIP and port", "10.0.0.7:10251")
	setAnnotation(kaironv1.AnnotationNodeMigrationEndpoint, "6.6.6.6:10251")
	waitEndpoint("a rewritten endpoint corrected", "10.0.0.7:10251")
	setAnnotation(kaironv1.AnnotationNodeMigrationPort, "10252")
	waitEndpoint("the endpoint following the port", "10.0.0.7:10252")
	setAnnotation(kaironv1.AnnotationNodeMigrationPort, "")
	waitEndpoint("the endpoint removed with the port", "")
}
