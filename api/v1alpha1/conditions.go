package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// CauseTypeDisruptionBudget is the cause a refused MachineMigration carries
// when a MachineDisruptionBudget does not allow the move now (HTTP 429, as
// the Eviction API answers for a PodDisruptionBudget). Clients match the
// cause, never the message.
const CauseTypeDisruptionBudget metav1.CauseType = "DisruptionBudget"
