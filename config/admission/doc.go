// Package admission holds the specs of Kairon's ValidatingAdmissionPolicies
// (admissionregistration.k8s.io/v1), which the API server enforces without a
// webhook: node-confinement.yaml confines node agents to their own node,
// machine-placement.yaml keeps placement with the scheduler. It also holds
// the MutatingAdmissionPolicy claim-finalizer.yaml, which adds the claim
// finalizer at creation. kairon-local reads them from here (embed.go); the
// chart renders copies of the same files (charts/kairon/files/admission/,
// written by `make generate`).
package admission
