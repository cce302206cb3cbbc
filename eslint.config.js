import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    ignores: [
      'dist/',
      'dist-sample/',
      'coverage/',
      'node_modules/',
      '.pgdata/',
      'bench/results/',
      'dist-bench/',
      'test/prisma/generated/',
      'examples/prisma/src/generated/',
      'bench/prisma/generated/',
    ],
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: { globals: { console: 'readonly', process: 'readonly', Buffer: 'readonly', setTimeout: 'readonly' } },
    rules: {
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      // Nest modules are classes with decorators and no members.
      '@typescript-eslint/no-extraneous-class': 'off',
    },
  },
);
