/** Types of `build.mjs`, for the TypeScript that imports it (its tests). */
export declare const REPOSITORY_ROOT: string;

export interface SampleBuild {
  /** Absolute path of the build's `sample-app/main.js`. */
  main: string;
  /** The build's directory, named after a hash of its inputs. */
  buildDir: string;
  /** True if this call compiled the build that is in place; false if it found one, or lost the race to an identical one. */
  compiled: boolean;
}

export interface SampleBuildOptions {
  /** Where builds go, relative to the repository root; default `dist-sample`. Must be inside the repository. */
  outDir?: string;
  /** Writes the compiled app into `stagingDir`; default `tsc -p tsconfig.sample.json --outDir <stagingDir>`. */
  compile?: (stagingDir: string) => Promise<void>;
  log?: (line: string) => void;
}

export declare function buildSampleApp(options?: SampleBuildOptions): Promise<SampleBuild>;
