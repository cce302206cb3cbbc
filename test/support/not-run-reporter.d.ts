/** Types of `not-run-reporter.js`, for the TypeScript that imports it (its spec): the parts of Jest's results it reads. */

export interface TestCaseResult {
  title: string;
  ancestorTitles: string[];
  status: 'passed' | 'failed' | 'pending' | 'skipped' | 'todo' | 'disabled' | 'focused';
}

export interface FileResult {
  testFilePath: string;
  testResults: TestCaseResult[];
  testExecError?: unknown;
}

export interface Totals {
  numPassedTests: number;
  numPendingTests: number;
  numPassedTestSuites: number;
  numPendingTestSuites: number;
}

export declare const NOT_RUN_BANNER: unique symbol;

/** Moves the passed stand-ins of `fileResult` (and the file, when they are all it holds) from passed to skipped. */
export declare function countApart(fileResult: FileResult, aggregated: Totals): void;

/** The end-of-run banner, or undefined when every suite ran. */
export declare function notRunBanner(results: { testResults: FileResult[] }, rootDir: string): string | undefined;

export default class NotRunReporter {
  constructor(globalConfig: { rootDir: string });
  onTestFileResult(test: unknown, fileResult: FileResult, aggregated: Totals): void;
  onRunComplete(testContexts: unknown, results: { testResults: FileResult[] }): void;
}
