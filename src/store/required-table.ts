import type { TableFix } from '../errors/messages.js';

/** A table the module needs, with the columns it must have and what creates it (for the start-up check). */
export interface RequiredTable extends TableFix {
  columns: readonly string[];
  /** Columns that only a table made by an earlier version lacks, which its migration adds when run again. */
  addedByUpgrade?: readonly string[];
}
