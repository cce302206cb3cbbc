// Resolve hooks (registered by without-typeorm.mjs) under which TypeORM's packages cannot be found, as in an
// app that never installed them: the import fails with ERR_MODULE_NOT_FOUND, and its specifier is reported.
const BLOCKED = ['typeorm', '@nestjs/typeorm', 'typeorm-transactional', '@nestjs-cls/transactional-adapter-typeorm'];
let port;

export function initialize(data) {
  port = data.port;
}

export async function resolve(specifier, context, nextResolve) {
  if (BLOCKED.some((name) => specifier === name || specifier.startsWith(`${name}/`))) {
    port.postMessage(specifier);
    throw Object.assign(new Error(`Cannot find package '${specifier}' (hidden by without-typeorm-hooks.mjs)`), {
      code: 'ERR_MODULE_NOT_FOUND',
    });
  }
  return nextResolve(specifier, context);
}
