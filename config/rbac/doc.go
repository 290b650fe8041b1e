// Package rbac holds the RBAC rules of Kairon's components, one YAML list
// of rbac.authorization.k8s.io/v1 PolicyRules per file, embedded by
// embed.go. kairon-local reads them from here; the chart renders copies of
// the same files (charts/kairon/files/rbac/, written by `make generate`).
package rbac
