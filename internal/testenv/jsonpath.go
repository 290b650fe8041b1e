package testenv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/jsonpath"
)

// Query names what `kubectl get` would read: one object, or with Name empty
// a list, filtered by the selectors.
type Query struct {
	// Namespace; empty is the kubeconfig's own (default unless it says
	// otherwise), as kubectl takes it. Ignored for cluster-scoped kinds.
	Namespace string
	// Resource as kubectl accepts it: plural, singular or kind, any case
	// kubectl's discovery matches ("machine", "machinemigrations", "events").
	Resource      string
	Name          string
	LabelSelector string
	FieldSelector string
}

// JSONPath prints what q reads through the jsonpath template, as `kubectl
// get ... -o jsonpath=TEMPLATE` prints it (missing keys print nothing), but
// in this process. Tests poll with it every PollInterval: a kubectl process
// per poll cost about 0.2 s of CPU, and a test waiting a minute ran one
// after another, taking most of a core from the tests beside it.
func JSONPath(kubeconfig string, q Query, template string) (string, error) {
	c, err := jsonpathClientFor(kubeconfig)
	if err != nil {
		return "", err
	}
	gvr, err := c.mapper.ResourceFor(schema.GroupVersionResource{Resource: q.Resource})
	if err != nil {
		return "", fmt.Errorf("resource %q: %w", q.Resource, err)
	}
	namespaced, err := c.namespaced(gvr)
	if err != nil {
		return "", err
	}
	all := c.dynamic.Resource(gvr)
	var resource dynamic.ResourceInterface = all
	if namespaced {
		ns := q.Namespace
		if ns == "" {
			ns = c.namespace
		}
		resource = all.Namespace(ns)
	}
	ctx := context.Background()
	var content map[string]any
	if q.Name != "" {
		obj, err := resource.Get(ctx, q.Name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		content = obj.UnstructuredContent()
	} else {
		list, err := resource.List(ctx, metav1.ListOptions{LabelSelector: q.LabelSelector, FieldSelector: q.FieldSelector})
		if err != nil {
			return "", err
		}
		content = list.UnstructuredContent()
	}
	j := jsonpath.New("get").AllowMissingKeys(true)
	if err := j.Parse(template); err != nil {
		return "", fmt.Errorf("jsonpath %q: %w", template, err)
	}
	var out bytes.Buffer
	if err := j.Execute(&out, content); err != nil {
		return "", fmt.Errorf("jsonpath %q: %w", template, err)
	}
	return out.String(), nil
}

type jsonpathClient struct {
	dynamic   dynamic.Interface
	mapper    meta.RESTMapper
	namespace string
}

func (c *jsonpathClient) namespaced(gvr schema.GroupVersionResource) (bool, error) {
	gvk, err := c.mapper.KindFor(gvr)
	if err != nil {
		return false, err
	}
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return false, err
	}
	return m.Scope.Name() == meta.RESTScopeNameNamespace, nil
}

// jsonpathClients: one client and discovery cache per kubeconfig's
// content, so that a rewritten kubeconfig (another cluster at the same
// path) gets its own.
var jsonpathClients sync.Map

func jsonpathClientFor(kubeconfig string) (*jsonpathClient, error) {
	b, err := os.ReadFile(kubeconfig)
	if err != nil {
		return nil, err
	}
	key := fmt.Sprintf("%s %x", kubeconfig, sha256.Sum256(b))
	if c, ok := jsonpathClients.Load(key); ok {
		return c.(*jsonpathClient), nil
	}
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{})
	cfg, err := loader.ClientConfig()
	if err != nil {
		return nil, err
	}
	// As the Env's own client: client-go's default of 5 requests a second
	// would stretch a 50 ms poll to 200 ms.
	cfg.QPS, cfg.Burst = 200, 400
	ns, _, err := loader.Namespace()
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	c := &jsonpathClient{
		dynamic: dyn,
		// Deferred: a kind it has not seen (a CRD installed later) makes it
		// read discovery again.
		mapper:    restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)),
		namespace: ns,
	}
	actual, _ := jsonpathClients.LoadOrStore(key, c)
	return actual.(*jsonpathClient), nil
}
