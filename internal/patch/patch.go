package patch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Option chooses how Status writes.
type Option func(*options)

type options struct {
	optimisticLock bool
	wholeStatus    bool
	ignoreNotFound bool
}

// WithOptimisticLock puts before's resourceVersion in the patch, so the
// write fails with a Conflict (apierrors.IsConflict) if anyone wrote the
// object since before was read. Choose it when the status depends on what
// was read, or when another writer shares the status:
//   - several writers share one status (a claim's binders on every
//     controller replica and the claim reconciler; a Machine's scheduler
//     and node agent), and a write from a stale copy must fail rather than,
//     say, turn Bound back into Pending or a Running phase back to Pending;
//   - conditions are a list, which a merge patch replaces whole: without
//     the lock a stale copy could drop a condition another writer just set;
//   - a phase machine (a migration's phases) must not step from a phase
//     that is no longer current.
//
// The caller decides what a Conflict means, usually to look again with a
// fresh object. Without the lock the write is last-writer-wins, which suits
// a status only one controller computes from the world as a whole (a
// budget's or a quota's counts), where a stale write is soon corrected.
func WithOptimisticLock() Option {
	return func(o *options) { o.optimisticLock = true }
}

// WholeStatus sends all of after's status rather than what differs from
// before's. Choose it when the writer owns the whole status: a diff against
// a status the server has never seen leaves out fields whose value did not
// change from the zero value (readyReplicas: 0), which the server then
// never stores and kubectl prints as blank. Fields that before's status has
// and after's lacks are sent as null, so a cleared field is cleared.
func WholeStatus() Option {
	return func(o *options) { o.wholeStatus = true }
}

// IgnoreNotFound makes a write to an object that is gone no error. Choose
// it when a deleted object needs no status and nothing else is done with
// it: the deletion brings its own reconcile. Leave it out when the caller
// tells "gone" apart from "written", for instance to log only writes.
func IgnoreNotFound() Option {
	return func(o *options) { o.ignoreNotFound = true }
}

// Status writes after's status if it differs from before's, and makes no
// call when it does not (equality.Semantic decides). before is the object
// as read from the API server, after the same object with the status
// computed for it; both point to the same API type, a struct with a field
// named Status. Only the status is written: the status subresource ignores
// changes to metadata and spec.
//
// Without WholeStatus the patch carries the fields that differ between
// before and after, as client.MergeFrom computes them, fields cleared in
// after included (as null); fields only another writer sets are left out.
//
// On success after holds the object as the server returned it, its new
// resourceVersion included, so a further locked write can start from it.
func Status(ctx context.Context, c client.StatusClient, before, after client.Object, opts ...Option) error {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	was, err := statusOf(before)
	if err != nil {
		return err
	}
	now, err := statusOf(after)
	if err != nil {
		return err
	}
	if was.Type() != now.Type() {
		return fmt.Errorf("patch: before is a %T, after a %T", before, after)
	}
	if equality.Semantic.DeepEqual(was.Interface(), now.Interface()) {
		return nil
	}

	var p client.Patch
	switch {
	case o.wholeStatus:
		body, err := wholeStatusPatch(before, was.Interface(), now.Interface(), o.optimisticLock)
		if err != nil {
			return err
		}
		p = client.RawPatch(types.MergePatchType, body)
	case o.optimisticLock:
		p = client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
	default:
		p = client.MergeFrom(before)
	}
	err = c.Status().Patch(ctx, after, p)
	if o.ignoreNotFound {
		err = client.IgnoreNotFound(err)
	}
	return err
}

// statusOf returns the Status field of obj, a pointer to an API struct.
func statusOf(obj client.Object) (reflect.Value, error) {
	v := reflect.ValueOf(obj)
	if obj == nil || v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return reflect.Value{}, fmt.Errorf("patch: %T is not a pointer to an API struct", obj)
	}
	status := v.Elem().FieldByName("Status")
	if !status.IsValid() {
		return reflect.Value{}, fmt.Errorf("patch: %T has no Status field", obj)
	}
	return status, nil
}

// wholeStatusPatch is the merge patch that makes the status now: all of
// it, with null for each field was has and now lacks, and the
// resourceVersion of before when locked.
func wholeStatusPatch(before client.Object, was, now any, lock bool) ([]byte, error) {
	wasMap, err := toMap(was)
	if err != nil {
		return nil, err
	}
	nowMap, err := toMap(now)
	if err != nil {
		return nil, err
	}
	nullCleared(wasMap, nowMap)
	body := map[string]any{"status": nowMap}
	if lock {
		version := before.GetResourceVersion()
		if version == "" {
			return nil, errors.New("patch: cannot lock, before has no resourceVersion")
		}
		body["metadata"] = map[string]any{"resourceVersion": version}
	}
	return json.Marshal(body)
}

func toMap(status any) (map[string]any, error) {
	raw, err := json.Marshal(status)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("patch: status is not a JSON object: %w", err)
	}
	return m, nil
}

// nullCleared sets to nil every key of now that was has and now lacks, in
// now and in the objects nested in both. A merge patch merges objects key
// by key and replaces lists whole, so lists need nothing.
func nullCleared(was, now map[string]any) {
	for k, old := range was {
		cur, ok := now[k]
		if !ok {
			now[k] = nil
			continue
		}
		oldMap, oldIsMap := old.(map[string]any)
		curMap, curIsMap := cur.(map[string]any)
		if oldIsMap && curIsMap {
			nullCleared(oldMap, curMap)
		}
	}
}
