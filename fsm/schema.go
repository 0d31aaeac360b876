package fsm

import (
	"fmt"

	"github.com/hashicorp/go-memdb"
)

// Table names, usable with StateStore.TableIndex.
const (
	TableWorkers          = "workers"
	TableQueries          = "queries"
	TableTasks            = "tasks"
	TableTokens           = "tokens"
	TableOperatorVersions = "operator_versions"
	TableContracts        = "contracts"
	TableLedger           = "ledger"
	TableHealthActions    = "health_actions"
	TableIdempotency      = "idempotency"
	TableSlotMaps         = "slot_maps"
	// TableHostedTasks holds HostedTask records (cross-org migration).
	TableHostedTasks = "hosted_tasks"

	// tableIndexes holds tableIndexEntry rows; it is internal.
	tableIndexes = "index"
	// appliedIndexKey is the tableIndexes row holding the highest log index
	// applied (including commands that were rejected or skipped).
	appliedIndexKey = "_applied"
)

// Index names.
const (
	indexID     = "id"
	indexQuery  = "query"
	indexWorker = "worker"
	// indexMovingFrom indexes tasks by Task.MovingFrom.
	indexMovingFrom = "moving_from"
	indexPlaced     = "placed"
	indexPartner    = "partner"
	indexOp         = "operator"
	indexApplied    = "index"
	indexSecret     = "secret"
)

func stateSchema() *memdb.DBSchema {
	return &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{
		TableWorkers: {Name: TableWorkers, Indexes: map[string]*memdb.IndexSchema{
			indexID: {Name: indexID, Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
		}},
		TableQueries: {Name: TableQueries, Indexes: map[string]*memdb.IndexSchema{
			indexID: {Name: indexID, Unique: true, Indexer: &memdb.StringFieldIndex{Field: "Name"}},
		}},
		TableTasks: {Name: TableTasks, Indexes: map[string]*memdb.IndexSchema{
			indexID:    {Name: indexID, Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
			indexQuery: {Name: indexQuery, Indexer: &memdb.StringFieldIndex{Field: "Query"}},
			// Unplaced tasks (WorkerID "") are absent from this index.
			indexWorker: {Name: indexWorker, AllowMissing: true, Indexer: &memdb.StringFieldIndex{Field: "WorkerID"}},
			// Only tasks in a live move are in this index.
			indexMovingFrom: {Name: indexMovingFrom, AllowMissing: true, Indexer: &memdb.StringFieldIndex{Field: "MovingFrom"}},
			indexPlaced: {Name: indexPlaced, Indexer: &memdb.ConditionalIndex{Conditional: func(obj any) (bool, error) {
				t, ok := obj.(*Task)
				if !ok {
					return false, fmt.Errorf("placed index: unexpected %T", obj)
				}
				return t.WorkerID != "", nil
			}}},
		}},
		TableTokens: {Name: TableTokens, Indexes: map[string]*memdb.IndexSchema{
			indexID:     {Name: indexID, Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
			indexSecret: {Name: indexSecret, Unique: true, Indexer: &memdb.StringFieldIndex{Field: "SecretHash"}},
		}},
		TableOperatorVersions: {Name: TableOperatorVersions, Indexes: map[string]*memdb.IndexSchema{
			indexID: {Name: indexID, Unique: true, Indexer: &memdb.CompoundIndex{Indexes: []memdb.Indexer{
				&memdb.StringFieldIndex{Field: "Operator"},
				&memdb.StringFieldIndex{Field: "Version"},
			}}},
			indexOp: {Name: indexOp, Indexer: &memdb.StringFieldIndex{Field: "Operator"}},
		}},
		TableContracts: {Name: TableContracts, Indexes: map[string]*memdb.IndexSchema{
			indexID:      {Name: indexID, Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
			indexPartner: {Name: indexPartner, Indexer: &memdb.StringFieldIndex{Field: "Partner"}},
		}},
		TableLedger: {Name: TableLedger, Indexes: map[string]*memdb.IndexSchema{
			indexID: {Name: indexID, Unique: true, Indexer: &memdb.UintFieldIndex{Field: "Seq"}},
		}},
		TableHealthActions: {Name: TableHealthActions, Indexes: map[string]*memdb.IndexSchema{
			indexID:    {Name: indexID, Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
			indexQuery: {Name: indexQuery, AllowMissing: true, Indexer: &memdb.StringFieldIndex{Field: "Query"}},
		}},
		TableIdempotency: {Name: TableIdempotency, Indexes: map[string]*memdb.IndexSchema{
			indexID: {Name: indexID, Unique: true, Indexer: &memdb.StringFieldIndex{Field: "Key"}},
			// Non-unique: memdb orders equal values by primary key, so pruning
			// "oldest first" is deterministic.
			indexApplied: {Name: indexApplied, Indexer: &memdb.UintFieldIndex{Field: "Index"}},
		}},
		TableHostedTasks: {Name: TableHostedTasks, Indexes: map[string]*memdb.IndexSchema{
			indexID:    {Name: indexID, Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
			indexQuery: {Name: indexQuery, Indexer: &memdb.StringFieldIndex{Field: "Query"}},
		}},
		TableSlotMaps: {Name: TableSlotMaps, Indexes: map[string]*memdb.IndexSchema{
			indexID: {Name: indexID, Unique: true, Indexer: &memdb.CompoundIndex{Indexes: []memdb.Indexer{
				&memdb.StringFieldIndex{Field: "Query"},
				&memdb.StringFieldIndex{Field: "Fragment"},
			}}},
			indexQuery: {Name: indexQuery, Indexer: &memdb.StringFieldIndex{Field: "Query"}},
		}},
		tableIndexes: {Name: tableIndexes, Indexes: map[string]*memdb.IndexSchema{
			indexID: {Name: indexID, Unique: true, Indexer: &memdb.StringFieldIndex{Field: "Table"}},
		}},
	}}
}
