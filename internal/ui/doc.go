// Package ui is kairon-ui: a web dashboard and JSON API over the Kairon
// objects of one cluster, served from an informer cache, with pages that
// update live through server-sent events, and (with Options.AllowWrite)
// actions made with the user's own identity: see auth.go.
//
//   - main.go, server.go: the flags, the Server, its cache and the hub of
//     live updates;
//   - api.go, paging.go, gzip.go: the JSON API's shapes, its pages and
//     compression;
//   - pages.go: the HTML pages;
//   - auth.go: who the user is and what they may do;
//   - actions.go, evacuations.go: evacuate a node, migrate a Machine, scale
//     a pool, run through package ops; evacuations run as jobs the pages
//     follow.
//
// Every number about a MachineDisruptionBudget is computed by
// rules.ComputeBudgetStates, the code kaironctl, evacuation and the
// admission webhook decide with; this package has no arithmetic of its own.
package ui
