import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';

// Jest loads global setup through require() without its module mapper, so
// the base setup is named without the `.js` that ESM source needs.
const BASE_SETUP = '../../support/global-setup';

/**
 * The default run's setup (a database: DATABASE_URL or an embedded server),
 * then one build of the sample app, which the scenarios start as real
 * processes (`node dist-sample/<build>/sample-app/main.js`).
 */
export default async function reliabilityGlobalSetup(_globalConfig: unknown, projectConfig: { rootDir: string }): Promise<void> {
  const { default: baseSetup } = (await import(BASE_SETUP)) as typeof import('../../support/global-setup.js');
  await baseSetup();
  const root = projectConfig.rootDir;
  const started = Date.now();
  try {
    // The same build as `npm run sample` (sample-app/build.mjs); it prints the path of main.js.
    const { stdout } = await promisify(execFile)(process.execPath, [join(root, 'sample-app', 'build.mjs')], {
      cwd: root,
      maxBuffer: 16 * 1024 * 1024,
    });
    // Workers inherit it through the environment (sample-process.ts reads it).
    process.env.SAMPLE_MAIN = stdout.trim();
  } catch (error) {
    const { stdout, stderr } = error as { stdout?: string; stderr?: string };
    throw new Error(`Building the sample app (node sample-app/build.mjs) failed:\n${stdout ?? ''}${stderr ?? ''}`, {
      cause: error,
    });
  }
  console.log(`Built the sample app (${process.env.SAMPLE_MAIN}) in ${Date.now() - started} ms.`);
}
