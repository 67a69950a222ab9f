//! The integration tests of the tessera facade (whole-stack tests): one test
//! binary, one module per topic.

mod checkpoint_resume;
mod custom_module_example;
