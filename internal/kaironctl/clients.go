package kaironctl

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// scheme knows Kairon's kinds and client-go's.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
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
		if o.client, err = client.NewWithWatch(cfg, client.Options{Scheme: scheme}); err != nil {
			return nil, err
		}
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
