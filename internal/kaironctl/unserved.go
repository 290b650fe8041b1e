package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// unservedError says that the API server does not serve a kind kaironctl
// maps without asking it (restMapper): Kairon's CRDs are not installed, or
// are older than this kaironctl. It is a no-match error (meta.IsNoMatchError)
// as discovery would have given, never a NotFound: `release` and `delete`
// wait for a NotFound, and must not take a missing kind for a gone object.
type unservedError struct {
	resource schema.GroupResource
}

func (e *unservedError) Error() string {
	return fmt.Sprintf("the API server does not serve %s: is Kairon installed in this cluster, with CRDs as new as this kaironctl? (docs/guides/helm.md)", e.resource)
}

// Unwrap does not give the API server's 404: it would make the error a
// NotFound for apierrors.IsNotFound.
func (e *unservedError) Unwrap() error {
	return &meta.NoResourceMatchError{PartialResource: e.resource.WithVersion("")}
}

// unserved turns the API server's answer to a path it does not serve into
// an unservedError. It tells that answer from an object's NotFound by its
// form: for a missing object the API server sends a Status, and client-go
// marks every 404 that came without one as an unexpected response.
func unserved(err error) error {
	var status apierrors.APIStatus
	if err == nil || !errors.As(err, &status) {
		return err
	}
	s := status.Status()
	if s.Code != http.StatusNotFound || s.Details == nil {
		return err
	}
	for _, c := range s.Details.Causes {
		if c.Type == metav1.CauseTypeUnexpectedServerResponse {
			return &unservedError{resource: schema.GroupResource{Group: s.Details.Group, Resource: s.Details.Kind}}
		}
	}
	return err
}

// tellingUnservedKinds wraps c so that every request to a path the API
// server does not serve fails with an unservedError.
func tellingUnservedKinds(c client.WithWatch) client.WithWatch {
	return interceptor.NewClient(c, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			return unserved(c.Get(ctx, key, obj, opts...))
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			return unserved(c.List(ctx, list, opts...))
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			return unserved(c.Create(ctx, obj, opts...))
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			return unserved(c.Delete(ctx, obj, opts...))
		},
		DeleteAllOf: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteAllOfOption) error {
			return unserved(c.DeleteAllOf(ctx, obj, opts...))
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			return unserved(c.Update(ctx, obj, opts...))
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			return unserved(c.Patch(ctx, obj, patch, opts...))
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			return unserved(c.Apply(ctx, obj, opts...))
		},
		Watch: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error) {
			w, err := c.Watch(ctx, list, opts...)
			return w, unserved(err)
		},
		SubResourceGet: func(ctx context.Context, c client.Client, sub string, obj, subObj client.Object, opts ...client.SubResourceGetOption) error {
			return unserved(c.SubResource(sub).Get(ctx, obj, subObj, opts...))
		},
		SubResourceCreate: func(ctx context.Context, c client.Client, sub string, obj, subObj client.Object, opts ...client.SubResourceCreateOption) error {
			return unserved(c.SubResource(sub).Create(ctx, obj, subObj, opts...))
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			return unserved(c.SubResource(sub).Update(ctx, obj, opts...))
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			return unserved(c.SubResource(sub).Patch(ctx, obj, patch, opts...))
		},
		SubResourceApply: func(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
			return unserved(c.SubResource(sub).Apply(ctx, obj, opts...))
		},
	})
}
