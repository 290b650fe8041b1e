package testenv

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Create creates obj through the Env's client and fails t if the API
// server refuses it: the tests build their world with it.
func (e *Env) Create(t TB, obj client.Object) {
	t.Helper()
	if err := e.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

// SetStatus writes obj's status subresource as obj holds it and fails t
// if the API server refuses it: it stands in for the controller or agent
// that would write it.
func (e *Env) SetStatus(t TB, obj client.Object) {
	t.Helper()
	if err := e.Client.Status().Update(context.Background(), obj); err != nil {
		t.Fatalf("updating status of %T %s: %v", obj, obj.GetName(), err)
	}
}
