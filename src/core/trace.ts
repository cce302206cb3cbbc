/** What an execution learnt on its way, for its outcome event. */
export interface Trace {
  attempt?: number;
  failure?: 'released' | 'kept';
}
