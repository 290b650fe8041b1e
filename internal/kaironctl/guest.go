package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/execstream"
)

// What exec, cp and console share: naming the Machine (a Machine or a
// claim's bound Machine) and opening an execstream to its node agent.

// machineRef is what the user named, resolved: the Machine, and how the
// user wrote it (for messages).
type machineRef struct {
	machine *kaironv1.Machine
	arg     string
}

func (r *machineRef) String() string {
	key := r.machine.Namespace + "/" + r.machine.Name
	if !strings.Contains(r.arg, "/") || strings.HasPrefix(r.arg, "machine/") || strings.HasPrefix(r.arg, "machines/") {
		return "machine " + key
	}
	return "machine " + key + " (" + r.arg + ")"
}

// resolveMachine finds the Machine arg names: NAME or machine/NAME (any
// name of the machines kind), or mc/NAME (any name of the machineclaims
// kind: the claim's bound Machine). what names the argument in errors.
func (o *Options) resolveMachine(ctx context.Context, what, arg string) (*machineRef, error) {
	if arg == "" {
		return nil, fmt.Errorf("%s is empty; give a Machine NAME or a claim mc/NAME", what)
	}
	ns, err := o.Namespace()
	if err != nil {
		return nil, err
	}
	c, err := o.Client()
	if err != nil {
		return nil, err
	}
	machines, _ := lookupKind("machines")
	k, name, ok, err := splitKindName(arg)
	switch {
	case !ok:
		return nil, fmt.Errorf("%s %q: want NAME, machine/NAME or mc/NAME", what, arg)
	case err != nil:
		return nil, fmt.Errorf("%s %q: %w", what, arg, err)
	}
	if k != nil {
		switch k.Resource {
		case "machines":
		case "machineclaims":
			var claim kaironv1.MachineClaim
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &claim); err != nil {
				return nil, fmt.Errorf("%s: %w", what, o.objectError(k, ns, name, err))
			}
			if claim.Status.MachineName == "" {
				phase := claim.Status.Phase
				if phase == "" {
					phase = kaironv1.ClaimPending
				}
				return nil, fmt.Errorf("%s: machineclaim %s/%s is not bound to a Machine yet (phase %s)", what, ns, name, phase)
			}
			name = claim.Status.MachineName
		default:
			return nil, fmt.Errorf("%s %q: %s are not Machines; give a Machine NAME or a claim mc/NAME", what, arg, k.Resource)
		}
	}
	var m kaironv1.Machine
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &m); err != nil {
		notFound := apierrors.IsNotFound(err)
		err = o.objectError(machines, ns, name, err)
		if k == nil && notFound && claimNamed(ctx, c, ns, name) {
			// `kaironctl claim` prints the claim's name first: the
			// likeliest slip is to pass it as it is.
			return nil, fmt.Errorf("%s: %w; machineclaim %q is: name it mc/%s for the Machine bound to it", what, err, name, name)
		}
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	ref := &machineRef{machine: &m, arg: arg}
	if m.Spec.NodeName == "" {
		phase := m.Status.Phase
		if phase == "" {
			phase = kaironv1.MachinePending
		}
		return nil, fmt.Errorf("%s has no node yet (phase %s)", ref, phase)
	}
	return ref, nil
}

// claimNamed says whether namespace ns has a MachineClaim called name.
func claimNamed(ctx context.Context, c client.Client, ns, name string) bool {
	return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &kaironv1.MachineClaim{}) == nil
}

// openStream asks the node agent of ref's Machine for a session at path
// (exec, files/read, files/write or console/attach) and returns the
// upgraded connection. Like logs, the request goes through the API
// server's node proxy, or straight to an agent on this host's loopback
// (kairon-local) with the user's own credentials.
func (o *Options) openStream(ctx context.Context, ref *machineRef, path string, params url.Values, needs string) (io.ReadWriteCloser, error) {
	c, err := o.Client()
	if err != nil {
		return nil, err
	}
	cfg, err := o.RESTConfig()
	if err != nil {
		return nil, err
	}
	m := ref.machine
	// The parameters travel in a header (execstream.ParamsHeader): the
	// node proxy drops an upgrade request's query.
	suffix := "v1/machines/" + url.PathEscape(m.Namespace) + "/" + url.PathEscape(m.Name) + "/" + path
	var n corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: m.Spec.NodeName}, &n); err != nil {
		return nil, fmt.Errorf("%s: node %s: %w", ref, m.Spec.NodeName, err)
	}
	cfg = rest.CopyConfig(cfg)
	// Upgrades are HTTP/1.1 only.
	cfg.TLSClientConfig.NextProtos = []string{"http/1.1"}
	var target string
	if address, ok := loopbackEndpoint(&n); ok {
		// The agent's serving certificate is its own, like a kubelet's; the
		// address is this host's loopback, so there is no one in between.
		cfg.Insecure, cfg.CAData, cfg.CAFile = true, nil, ""
		target = "https://" + address + "/" + suffix
	} else {
		target = strings.TrimSuffix(cfg.Host, "/") + "/api/v1/nodes/" + url.PathEscape("https:"+m.Spec.NodeName+":") + "/proxy/" + suffix
		if !strings.Contains(cfg.Host, "://") {
			target = "https://" + strings.TrimPrefix(target, "/")
		}
	}
	// The transport carries --as, --as-group and --as-uid as the standard
	// Impersonate-* headers, to the agent as to the API server: an agent
	// reached directly checks that the credential may impersonate them,
	// then authorizes and logs the session as the impersonated user
	// (docs/guides/exec.md). Through the node proxy, the API server does
	// both itself.
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, err
	}
	conn, err := execstream.Upgrade(ctx, rt, target, params)
	var status *execstream.StatusError
	switch {
	case errors.As(err, &status) && status.Code == 401:
		return nil, fmt.Errorf("%s on node %s: %w (the agent accepts a client certificate of its --client-ca-file or a bearer token)", ref, m.Spec.NodeName, err)
	case errors.As(err, &status) && status.Code == 403:
		return nil, fmt.Errorf("%s on node %s: %w (this needs %s in namespace %s%s)", ref, m.Spec.NodeName, err, needs, m.Namespace, actingAs(cfg))
	case err != nil:
		return nil, fmt.Errorf("%s on node %s: %w", ref, m.Spec.NodeName, err)
	}
	return conn, nil
}

// actingAs says, for a refusal, whom --as made the request act as: the
// permission is that user's, and the credential must be allowed to
// impersonate them.
func actingAs(cfg *rest.Config) string {
	if cfg.Impersonate.UserName == "" {
		return ""
	}
	return fmt.Sprintf(" for user %s (--as), whom the credential must be allowed to impersonate", cfg.Impersonate.UserName)
}
