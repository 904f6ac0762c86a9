/**
 * ESLint for the panel (`npm run lint`, in `make lint`): ESLint's and
 * typescript-eslint's recommended rules on the sources and tests. Layout is
 * prettier's (.prettierrc), so no style rules here.
 */
import js from '@eslint/js';
import { defineConfig, globalIgnores } from 'eslint/config';
import tseslint from 'typescript-eslint';

export default defineConfig([
  // tsc's output (node_modules/ is ignored by default).
  globalIgnores(['lib/']),
  js.configs.recommended,
  tseslint.configs.recommended,
  {
    rules: {
      // `const { ranks: _ranks, ...without } = mesh()`: leaving a key out by
      // destructuring is how a test makes a mesh without one.
      '@typescript-eslint/no-unused-vars': ['error', { ignoreRestSiblings: true }]
    }
  }
]);
