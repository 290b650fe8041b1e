// Package patch writes the status of Kairon's objects, one way for every
// controller: Status (patch.go) compares the status an object was read with
// to the one computed for it and, if they differ, sends a JSON merge patch
// to the status subresource. The options say how much of the status the
// patch carries and what it may overwrite; each says why a writer would
// want it.
//
// It is a small cousin of Cluster API's util/patch helper, which also skips
// the call when nothing changed and can carry the resourceVersion. Unlike
// it, Status writes only the status and has no three-way merge of
// conditions: a writer that shares conditions with others takes the lock.
package patch
