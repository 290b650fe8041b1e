package controller

import (
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// updatesThat passes every create, delete and generic event, and the
// updates of a T for which changed says the change matters. An update
// whose two objects are not both a T passes: a spare reconcile costs less
// than a missed one.
func updatesThat[T client.Object](changed func(old, cur T) bool) predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		old, okOld := e.ObjectOld.(T)
		cur, okNew := e.ObjectNew.(T)
		if !okOld || !okNew {
			return true
		}
		return changed(old, cur)
	}}
}
