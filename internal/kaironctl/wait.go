package kaironctl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/zyvor/kairon/internal/ops"
)

// Every command that waits for something in the cluster (claim --wait,
// migrate --wait, evacuate --wait between its passes, release, delete)
// waits with waitFor: a list, then a watch from the version listed, and the
// condition asked after the list and after every change the watch brings.
// Waiting on an object it has just written (claim), a command starts from
// that object and its version instead of a list (waitForWritten).

// watcher is the part of a controller-runtime client that waitFor uses.
type watcher interface {
	List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error
	Watch(ctx context.Context, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error)
}

// selection is what waitFor watches: the objects of one kind in a namespace
// ("" for every namespace, and for cluster-scoped kinds) that match a field
// selector and a label selector.
type selection struct {
	// newList returns an empty list of the kind.
	newList   func() client.ObjectList
	namespace string
	fields    fields.Selector // nil selects everything
	labels    labels.Selector // nil selects everything
}

// selectionOf selects the one object named like obj, of obj's kind.
func selectionOf(obj client.Object) (selection, error) {
	newList, err := listFor(obj)
	if err != nil {
		return selection{}, err
	}
	return selection{
		newList:   newList,
		namespace: obj.GetNamespace(),
		fields:    fields.OneTermEqualSelector("metadata.name", obj.GetName()),
	}, nil
}

// listFor returns a constructor of empty lists of obj's kind: an
// unstructured list for an unstructured obj, else the typed list the
// scheme has for it.
func listFor(obj client.Object) (func() client.ObjectList, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		gvk := u.GroupVersionKind()
		gvk.Kind += "List"
		return func() client.ObjectList {
			l := &unstructured.UnstructuredList{}
			l.SetGroupVersionKind(gvk)
			return l
		}, nil
	}
	gvk, err := apiutil.GVKForObject(obj, scheme)
	if err != nil {
		return nil, err
	}
	gvk.Kind += "List"
	if _, err := scheme.New(gvk); err != nil {
		return nil, err
	}
	return func() client.ObjectList {
		l, _ := scheme.New(gvk)
		return l.(client.ObjectList)
	}, nil
}

// listOptions are the options of a list; with watchFrom, of a watch from
// that resourceVersion.
func (s selection) listOptions(watchFrom string) *client.ListOptions {
	opts := &client.ListOptions{Namespace: s.namespace, FieldSelector: s.fields, LabelSelector: s.labels}
	if watchFrom != "" {
		opts.Raw = &metav1.ListOptions{ResourceVersion: watchFrom, AllowWatchBookmarks: true}
	}
	return opts
}

// waitError is why waitFor stopped before its condition held: its timeout
// or ctx's deadline passed (Unwrap gives context.DeadlineExceeded), or ctx
// was cancelled (context.Canceled).
type waitError struct {
	cause error
	// lastErr is the last failure to read the objects, if reading failed
	// after the last successful read.
	lastErr error
}

func (e *waitError) Error() string {
	msg := "stopped waiting: " + e.cause.Error()
	if e.lastErr != nil {
		msg += "; last error: " + e.lastErr.Error()
	}
	return msg
}

func (e *waitError) Unwrap() error { return e.cause }

const (
	// retryPause is how long waitFor waits before reading again after a
	// passing failure, so that a server that is away is not hammered.
	retryPause = 500 * time.Millisecond
	// finalReadTimeout bounds the read after the deadline.
	finalReadTimeout = 5 * time.Second
)

// waitFor waits until cond, asked about the objects sel selects (sorted by
// namespace and name), reports done, and returns them as last seen.
//
// It lists the objects, then watches them from the version listed; when
// the server closes the watch it watches again from the last version seen,
// and when that version is too old to resume from (410 Gone) it lists
// afresh, so no change is missed. Passing failures (the server restarting,
// a network error) are retried until the timeout; a refusal that retrying
// cannot change (forbidden, unauthorized, a bad request, a kind the server
// does not serve) is returned at once, as is an error from cond.
//
// timeout 0 waits as long as ctx allows. When the timeout or ctx's deadline
// passes, waitFor lists once more (a change that raced the deadline still
// counts) and then returns a *waitError.
func waitFor(ctx context.Context, c watcher, sel selection, timeout time.Duration, cond func(objs []client.Object) (done bool, err error)) ([]client.Object, error) {
	return waitFrom(ctx, c, sel, nil, timeout, cond)
}

// waitFrom is waitFor starting from written, the one object sel selects as
// a write of this command's returned it, instead of from a list; nil
// written lists first.
func waitFrom(ctx context.Context, c watcher, sel selection, written client.Object, timeout time.Duration, cond func(objs []client.Object) (done bool, err error)) ([]client.Object, error) {
	waitCtx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	w := &waiter{c: c, sel: sel, cond: cond, objs: map[string]client.Object{}}
	if written != nil {
		w.objs[objectKey(written)], w.rv = written, written.GetResourceVersion()
	}
	err := w.run(waitCtx)
	if err == nil || waitCtx.Err() == nil || !errors.Is(err, waitCtx.Err()) {
		return w.current(), err
	}
	cause := waitCtx.Err()
	if errors.Is(cause, context.DeadlineExceeded) {
		finalCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalReadTimeout)
		defer cancel()
		if lerr := w.list(finalCtx); lerr != nil {
			w.lastErr = lerr
		} else if done, cerr := w.check(); done || cerr != nil {
			return w.current(), cerr
		}
	}
	return w.current(), &waitError{cause: cause, lastErr: w.lastErr}
}

// waitForWritten is waitForObject for an object this command has just
// written: written is the object as the API server returned it, so the
// wait starts from it and watches from its resourceVersion, without a
// list first. The condition is asked about written before anything else.
func waitForWritten[T client.Object](ctx context.Context, c watcher, written T, timeout time.Duration, cond func(obj T) (done bool, err error)) (T, error) {
	return waitForObjectFrom(ctx, c, written, written, timeout, cond)
}

// waitForObject is waitFor for the one object named like obj (for an
// unstructured obj, of its kind). cond gets the object as it is now, or
// nil while it does not exist; waitForObject returns the object as last
// seen (nil if it never was).
func waitForObject[T client.Object](ctx context.Context, c watcher, obj T, timeout time.Duration, cond func(obj T) (done bool, err error)) (T, error) {
	return waitForObjectFrom(ctx, c, obj, nil, timeout, cond)
}

// waitForObjectFrom is waitForObject starting from written, unless nil.
func waitForObjectFrom[T client.Object](ctx context.Context, c watcher, obj T, written client.Object, timeout time.Duration, cond func(obj T) (done bool, err error)) (T, error) {
	var seen T
	sel, err := selectionOf(obj)
	if err != nil {
		return seen, err
	}
	_, err = waitFrom(ctx, c, sel, written, timeout, func(objs []client.Object) (bool, error) {
		var now T
		if len(objs) > 0 {
			var ok bool
			if now, ok = objs[0].(T); !ok {
				return false, fmt.Errorf("waiting for %s: the server sent a %T", obj.GetName(), objs[0])
			}
			seen = now
		}
		return cond(now)
	})
	return seen, err
}

// waiter is one run of waitFor.
type waiter struct {
	c    watcher
	sel  selection
	cond func([]client.Object) (bool, error)

	objs    map[string]client.Object // by namespace/name
	rv      string                   // the version to watch from
	lastErr error                    // the last failure since the last good read
}

func (w *waiter) run(ctx context.Context) error {
	needList := w.rv == ""
	if !needList {
		if done, err := w.check(); done || err != nil {
			return err
		}
	}
	for {
		if needList {
			if err := w.list(ctx); err != nil {
				if err := w.failed(ctx, err); err != nil {
					return err
				}
				continue
			}
			needList = false
			if done, err := w.check(); done || err != nil {
				return err
			}
		}
		wi, err := w.c.Watch(ctx, w.sel.newList(), w.sel.listOptions(w.rv))
		if err != nil {
			if err := w.failed(ctx, err); err != nil {
				return err
			}
			needList = true
			continue
		}
		done, relist, err := w.follow(ctx, wi)
		if done || err != nil {
			return err
		}
		needList = relist
	}
}

// failed handles a failed read: nil to try again after a pause, or the
// error that ends the wait.
func (w *waiter) failed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if !ops.Retriable(err) {
		return err
	}
	w.lastErr = err
	return pause(ctx)
}

// pause waits retryPause, or until ctx ends (returning its error).
func pause(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(retryPause):
		return nil
	}
}

// list reads the objects afresh.
func (w *waiter) list(ctx context.Context) error {
	l := w.sel.newList()
	if err := w.c.List(ctx, l, w.sel.listOptions("")); err != nil {
		return err
	}
	items, err := meta.ExtractList(l)
	if err != nil {
		return err
	}
	objs := make(map[string]client.Object, len(items))
	for _, item := range items {
		obj, ok := item.(client.Object)
		if !ok {
			return fmt.Errorf("listing: the server sent a %T", item)
		}
		objs[objectKey(obj)] = obj
	}
	w.objs, w.rv, w.lastErr = objs, l.GetResourceVersion(), nil
	return nil
}

// follow applies the watch's events until the condition is done (done),
// the watch ends (relist says whether to list before watching again), or
// an error ends the wait.
func (w *waiter) follow(ctx context.Context, wi watch.Interface) (done, relist bool, err error) {
	defer wi.Stop()
	events := 0
	for {
		select {
		case <-ctx.Done():
			return false, false, ctx.Err()
		case ev, ok := <-wi.ResultChan():
			if !ok {
				// Closed by the server: watch again from w.rv, after a
				// pause if it gave nothing, so a server that closes every
				// watch at once is not hammered.
				if events == 0 {
					return false, false, pause(ctx)
				}
				return false, false, nil
			}
			events++
			switch ev.Type {
			case watch.Added, watch.Modified, watch.Deleted:
				obj, ok := ev.Object.(client.Object)
				if !ok {
					continue
				}
				w.rv = obj.GetResourceVersion()
				if ev.Type == watch.Deleted {
					delete(w.objs, objectKey(obj))
				} else {
					w.objs[objectKey(obj)] = obj
				}
				w.lastErr = nil
			case watch.Bookmark:
				if obj, ok := ev.Object.(client.Object); ok {
					w.rv = obj.GetResourceVersion()
				}
				continue
			case watch.Error:
				// Typically 410 Gone: the version is too old to resume
				// from. List afresh.
				werr := apierrors.FromObject(ev.Object)
				if !apierrors.IsResourceExpired(werr) && !apierrors.IsGone(werr) {
					if err := w.failed(ctx, werr); err != nil {
						return false, false, err
					}
				}
				return false, true, nil
			default:
				continue
			}
			if done, err := w.check(); done || err != nil {
				return done, false, err
			}
		}
	}
}

// check asks the condition about the objects as they are now.
func (w *waiter) check() (bool, error) { return w.cond(w.current()) }

// current is the objects, sorted by namespace and name.
func (w *waiter) current() []client.Object {
	out := make([]client.Object, 0, len(w.objs))
	for _, obj := range w.objs {
		out = append(out, obj)
	}
	slices.SortFunc(out, func(a, b client.Object) int {
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	})
	return out
}

func objectKey(obj client.Object) string { return obj.GetNamespace() + "/" + obj.GetName() }
