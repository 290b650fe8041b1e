package testenv

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// WatchNamespace calls handle, in order, for every change to objects of
// list's kind in ns from now until the test ends. A watch the API server
// ends is opened again from the last revision seen, so nothing is missed.
func (e *Env) WatchNamespace(t testing.TB, ns string, list client.ObjectList, handle func(watch.EventType, client.Object)) {
	t.Helper()
	wc, err := client.NewWithWatch(e.Config, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := wc.List(ctx, list, client.InNamespace(ns)); err != nil {
		cancel()
		t.Fatal(err)
	}
	rv := list.GetResourceVersion()
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			w, err := wc.Watch(ctx, list, &client.ListOptions{Namespace: ns, Raw: &metav1.ListOptions{ResourceVersion: rv}})
			if err != nil {
				if ctx.Err() == nil {
					t.Logf("watching %T: %v", list, err)
				}
				// Back off before opening it again, unless the test ended.
				select {
				case <-ctx.Done():
				case <-time.After(PollInterval):
				}
				continue
			}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					if ctx.Err() == nil {
						t.Errorf("watching %T from revision %s: %v", list, rv, apierrors.FromObject(ev.Object))
					}
					break
				}
				o, ok := ev.Object.(client.Object)
				if !ok {
					continue
				}
				rv = o.GetResourceVersion()
				handle(ev.Type, o)
			}
			w.Stop()
		}
	}()
}

// StripFinalizers removes the finalizers from ns's Machines and claims, so
// that the namespace can be deleted once no controller or agent serves
// them any more. Errors are ignored: it runs in cleanups.
func (e *Env) StripFinalizers(ns string) {
	ctx := context.Background()
	var machines kaironv1.MachineList
	var claims kaironv1.MachineClaimList
	_ = e.Client.List(ctx, &machines, client.InNamespace(ns))
	_ = e.Client.List(ctx, &claims, client.InNamespace(ns))
	var objs []client.Object
	for i := range machines.Items {
		objs = append(objs, &machines.Items[i])
	}
	for i := range claims.Items {
		objs = append(objs, &claims.Items[i])
	}
	for _, o := range objs {
		if len(o.GetFinalizers()) > 0 {
			_ = e.Client.Patch(ctx, o, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
		}
	}
}
