// Package rules holds the decisions Kairon makes in more than one place,
// each decided once: the disruption-budget arithmetic, the evacuation plan,
// placement fit and the resources a Machine charges, and quota usage.
// kairon-controller (scheduler, webhooks, budget status, cordon evacuation)
// and kaironctl (budgets, evacuate, migrate, describe) call the same
// functions, so a user's preview and the controller's action cannot differ.
//
// The package needs only the API types, apimachinery and a client.Reader:
// no manager, webhook server or metrics, so kaironctl links the rules and
// not the controllers.
package rules
