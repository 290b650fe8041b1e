package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func newLogsCommand(o *Options) *cobra.Command {
	var (
		tail   int64
		follow bool
	)
	cmd := &cobra.Command{
		Use:   "logs ([machine] NAME | machine/NAME | mc/CLAIM)",
		Short: "Print a Machine's serial console",
		Long: `Print the serial console of a Machine's VM; mc/CLAIM names a claim's
Machine, as for exec. kaironctl asks the API server, which forwards the
request to the node agent on the Machine's node, the way kubectl logs
reaches a kubelet (GET /api/v1/nodes/NODE/proxy/...).`,
		Example: `  kaironctl logs machine web-1
  kaironctl logs web-1 --tail 20 -f
  kaironctl logs mc/job-42`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var target string
			switch len(args) {
			case 0:
				return usageError(cmd, "logs needs a machine NAME")
			case 1:
				if k, err := lookupKind(args[0]); err == nil {
					return usageError(cmd, "logs %s needs a NAME", k.Singular)
				}
				target = args[0]
			case 2:
				k, err := lookupKind(args[0])
				if err != nil {
					return err
				}
				if k.Resource != "machines" && k.Resource != "machineclaims" {
					return fmt.Errorf("logs works on machines and claims (the claim's Machine), not %s", k.Resource)
				}
				target = k.Singular + "/" + args[1]
			default:
				return usageError(cmd, "logs takes one machine NAME, got %d arguments", len(args))
			}
			if tail < -1 {
				return usageError(cmd, "--tail must be 0 or more (or -1 for the whole console), got %d", tail)
			}
			ctx := cmd.Context()
			ref, err := o.resolveMachine(ctx, "MACHINE", target)
			if err != nil {
				return err
			}
			ns, name, node := ref.machine.Namespace, ref.machine.Name, ref.machine.Spec.NodeName

			body, err := o.openConsole(ctx, node, ns, name, tail, follow)
			if err != nil {
				return fmt.Errorf("console of machine %s/%s from node %s: %w", ns, name, node, err)
			}
			defer body.Close()
			// Ending -f with Ctrl-C cancels ctx; that is not an error.
			if _, err := io.Copy(o.Out, body); err != nil && ctx.Err() == nil {
				return fmt.Errorf("console of machine %s/%s from node %s: %w", ns, name, node, err)
			}
			return nil
		},
	}
	cmd.Flags().Int64Var(&tail, "tail", -1, "Only the last N lines of the console (-1: all of it)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "Keep streaming the console as the VM writes it, until interrupted")
	return cmd
}

// openConsole streams a console from the node agent. Normally the API
// server's node proxy carries the request, as for kubectl logs. The API server
// refuses to proxy to loopback addresses, so for a node on this host
// (kairon-local) kaironctl calls the agent directly with the same
// credentials; the agent checks the client certificate against the cluster CA.
func (o *Options) openConsole(ctx context.Context, node, ns, name string, tail int64, follow bool) (io.ReadCloser, error) {
	c, err := o.Client()
	if err != nil {
		return nil, err
	}
	cs, err := o.Clientset()
	if err != nil {
		return nil, err
	}
	params := url.Values{}
	if tail >= 0 {
		params.Set("tail", strconv.FormatInt(tail, 10))
	}
	if follow {
		params.Set("follow", "true")
	}
	var n corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return nil, err
	}
	if address, ok := loopbackEndpoint(&n); ok {
		return o.openConsoleDirect(ctx, address, ns, name, params)
	}
	// client-go has no ProxyGet for nodes; this is the request it
	// would build: GET /api/v1/nodes/https:NODE:/proxy/v1/machines/...
	req := cs.CoreV1().RESTClient().Get().
		Resource("nodes").
		Name(utilnet.JoinSchemeNamePort("https", node, "")).
		SubResource("proxy").
		Suffix(consolePath(ns, name))
	for k, v := range params {
		req = req.Param(k, v[0])
	}
	body, err := req.Stream(ctx)
	if err != nil {
		err = agentError(err)
		if isProxyRefusal(err) {
			err = fmt.Errorf("%w (the API server does not proxy to loopback or link-local addresses; see the Node's status.addresses)", err)
		}
		return nil, err
	}
	return body, nil
}

// loopbackEndpoint is the agent's host:port when the Node is on loopback.
func loopbackEndpoint(n *corev1.Node) (string, bool) {
	port := n.Status.DaemonEndpoints.KubeletEndpoint.Port
	for _, a := range n.Status.Addresses {
		if ip := net.ParseIP(a.Address); a.Type == corev1.NodeInternalIP && ip != nil && ip.IsLoopback() && port > 0 {
			return net.JoinHostPort(a.Address, strconv.Itoa(int(port))), true
		}
	}
	return "", false
}

func (o *Options) openConsoleDirect(ctx context.Context, address, ns, name string, params url.Values) (io.ReadCloser, error) {
	cfg, err := o.RESTConfig()
	if err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	// The agent's serving certificate is its own, like a kubelet's; the
	// address is this host's loopback, so there is no one in between.
	cfg.Insecure, cfg.CAData, cfg.CAFile = true, nil, ""
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, err
	}
	u := url.URL{Scheme: "https", Host: address, Path: "/" + consolePath(ns, name), RawQuery: params.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		err := fmt.Errorf("node agent answered %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			err = fmt.Errorf("%w (the agent accepts a client certificate of its --client-ca-file or a bearer token)", err)
		case http.StatusForbidden:
			err = fmt.Errorf("%w (reading a console needs get on machines/console in namespace %s)", err, ns)
		}
		return nil, err
	}
	return resp.Body, nil
}

// consolePath is where the node agent serves a Machine's console.
func consolePath(ns, name string) string {
	return "v1/machines/" + url.PathEscape(ns) + "/" + url.PathEscape(name) + "/console"
}

// agentError brings out what the node agent itself answered: client-go
// reports a non-Status error body only as a generic "could not find the
// requested resource" with the body tucked away in the causes.
func agentError(err error) error {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return err
	}
	for _, c := range status.Status().Details.Causes {
		if msg := strings.TrimSpace(c.Message); c.Type == metav1.CauseTypeUnexpectedServerResponse && msg != "" {
			return fmt.Errorf("node agent answered %d: %s", status.Status().Code, msg)
		}
	}
	return err
}
