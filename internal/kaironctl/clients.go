package kaironctl

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// This file is the one place kaironctl builds clients. Every command talks
// to the API server through Client: typed objects for Kairon's kinds and
// the core kinds it reads (Nodes), and *unstructured.Unstructured for the
// generic get, describe, delete and scale, which print or touch any kind of
// the kinds table by name and show exactly what the server returned (the
// client decodes unstructured objects with client-go's dynamic serializer).
// Clientset is only for the two requests that are not about objects: the
// node proxy that carries `logs`, and the server version.

// scheme knows Kairon's kinds and the core ones (Nodes), the only typed
// objects kaironctl reads and writes; the other kinds it prints are
// unstructured. All of client-go's would cost every command a few more
// milliseconds of start-up.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(s))
	utilruntime.Must(kaironv1.AddToScheme(s))
	return s
}()

// RESTConfig is the client configuration from the kubeconfig flags.
func (o *Options) RESTConfig() (*rest.Config, error) {
	if o.restConfig == nil {
		cfg, err := o.ConfigFlags.ToRESTConfig()
		if err != nil {
			return nil, kubeconfigError(err)
		}
		cfg = rest.CopyConfig(cfg)
		// kubectl's defaults; client-go's 5 QPS makes waiting loops sluggish.
		if cfg.QPS == 0 {
			cfg.QPS, cfg.Burst = 50, 100
		}
		cfg.UserAgent = "kaironctl/" + clientVersion()
		// client-go's own default, which controller-runtime would otherwise
		// replace with its logger: the API server's warnings go to stderr
		// as they do for any client-go program.
		if cfg.WarningHandler == nil && cfg.WarningHandlerWithContext == nil {
			cfg.WarningHandler = rest.WarningLogger{}
		}
		o.restConfig = cfg
	}
	return o.restConfig, nil
}

// Client is the client every command uses, built once from the kubeconfig
// flags (--kubeconfig, --context) and kept.
func (o *Options) Client() (client.WithWatch, error) {
	if o.client == nil {
		cfg, err := o.RESTConfig()
		if err != nil {
			return nil, err
		}
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			return nil, err
		}
		mapper, err := restMapper(cfg, hc)
		if err != nil {
			return nil, err
		}
		c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme, HTTPClient: hc, Mapper: mapper})
		if err != nil {
			return nil, err
		}
		o.client = tellingUnservedKinds(c)
	}
	return o.client, nil
}

// Clientset is client-go's typed client, for the node proxy (logs) and the
// server version only; objects are read and written through Client.
func (o *Options) Clientset() (kubernetes.Interface, error) {
	if o.clientset == nil {
		cfg, err := o.RESTConfig()
		if err != nil {
			return nil, err
		}
		if o.clientset, err = kubernetes.NewForConfig(cfg); err != nil {
			return nil, err
		}
	}
	return o.clientset, nil
}

// Namespace is -n, else the current context's namespace, else "default".
func (o *Options) Namespace() (string, error) {
	ns, _, err := o.ConfigFlags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", kubeconfigError(err)
	}
	return ns, nil
}

// namespaceOf is where kind k is read: -n (Namespace) for a namespaced
// kind, "" (every namespace, or none) for a cluster-scoped one or with
// -A/--all-namespaces.
func (o *Options) namespaceOf(k *Kind, allNamespaces bool) (string, error) {
	if !k.Namespaced || allNamespaces {
		return metav1.NamespaceAll, nil
	}
	return o.Namespace()
}

// kubeconfigError says where the broken configuration came from.
func kubeconfigError(err error) error {
	return fmt.Errorf("loading the kubeconfig (--kubeconfig, else $KUBECONFIG, else ~/.kube/config; --context): %w", err)
}

// listMachines returns the Machines in ns ("" for all namespaces).
func (o *Options) listMachines(ctx context.Context, ns string) ([]kaironv1.Machine, error) {
	c, err := o.Client()
	if err != nil {
		return nil, err
	}
	var list kaironv1.MachineList
	opts := []client.ListOption{}
	if ns != metav1.NamespaceAll {
		opts = append(opts, client.InNamespace(ns))
	}
	if err := c.List(ctx, &list, opts...); err != nil {
		return nil, fmt.Errorf("listing machines: %w", err)
	}
	return list.Items, nil
}

// restMapper maps the kinds of the kinds table from the table itself, and
// any other kind through the API server's discovery. Asking discovery
// first costs every command two more round trips and the decoding of the
// server's whole API list before its first request: about a fifth of the
// wall time of a `get` (docs/benchmarks.md). A kind of the table the
// server does not serve (Kairon not installed) is then found out by the
// request itself: see tellingUnservedKinds.
func restMapper(cfg *rest.Config, hc *http.Client) (meta.RESTMapper, error) {
	discovered, err := apiutil.NewDynamicRESTMapper(cfg, hc)
	if err != nil {
		return nil, err
	}
	return meta.FirstHitRESTMapper{MultiRESTMapper: meta.MultiRESTMapper{tableMapper(), discovered}}, nil
}

// tableKinds is the kinds table, for tableMapper. Set in init: the table
// refers, through its describe functions, to Client.
var tableKinds func() []*Kind

func init() { tableKinds = func() []*Kind { return kinds } }

// tableMapper maps every kind of the kinds table.
func tableMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper(nil)
	for _, k := range tableKinds() {
		scope := meta.RESTScopeRoot
		if k.Namespaced {
			scope = meta.RESTScopeNamespace
		}
		gvk := k.GVR.GroupVersion().WithKind(k.GoKind)
		singular := k.GVR.GroupVersion().WithResource(strings.ToLower(k.GoKind))
		m.AddSpecific(gvk, k.GVR, singular, scope)
	}
	return m
}
