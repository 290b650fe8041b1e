// Package ops holds the user verbs that kaironctl (its commands and its MCP
// tools), kairon-ui and the cordon evacuation controller all perform, each
// written once:
//
//   - strategy.go: ParseStrategy, the cold|live a user names;
//   - refusal.go: IsMigrationRefusal (the cluster said "not now" to a
//     migration, not "no") and Retriable (a failed read or write worth
//     trying again);
//   - migrate.go: StartMigration, one Machine's MachineMigration after the
//     budgets were asked, with NotMigrated saying why it was not created;
//   - evacuate.go: EvacuationPass, one pass over a node's Machines that
//     creates the migrations the budgets allow, reporting each decision as
//     it is acted on;
//   - scale.go: Scale, replicas set through the scale subresource.
//
// The decisions themselves (which Machine a pass may move, the budgets,
// the migration an evacuation creates) are internal/rules'; ops is the
// executor that applies them through a controller-runtime client. It knows
// nothing of flags, HTTP or events: it returns typed results and errors,
// and each caller words them as its users have always read them.
package ops
