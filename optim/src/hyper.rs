//! [`Hyper`]: the hyperparameters of one parameter group, seen uniformly by
//! schedules (lr, momentum) and by state dicts (every field by name).

use tessera_tensor::Result;

/// The hyperparameters of a parameter group. Every optimizer's options
/// struct implements it, so schedules can set the learning rate and cycle
/// the momentum (SGD's `momentum`, Adam's `beta1`) of any optimizer, and
/// state dicts can save every field.
pub trait Hyper: Send + Sync + std::fmt::Debug {
    /// The learning rate.
    fn lr(&self) -> f64;
    /// Sets the learning rate.
    fn set_lr(&mut self, lr: f64);
    /// The weight decay.
    fn weight_decay(&self) -> f64;
    /// Sets the weight decay.
    fn set_weight_decay(&mut self, weight_decay: f64);
    /// The momentum a one-cycle schedule cycles: `momentum` for SGD,
    /// RMSprop and LARS, `beta1` for Adam, AdamW and LAMB; `None` for
    /// optimizers without one (Adagrad).
    fn momentum(&self) -> Option<f64>;
    /// Sets that momentum. Errors for optimizers without one.
    fn set_momentum(&mut self, momentum: f64) -> Result<()>;
    /// Every field by name (booleans as 0 or 1), as saved in a state dict.
    fn fields(&self) -> Vec<(&'static str, f64)>;
    /// Sets the field `name` (booleans: non-zero is true). Errors for an
    /// unknown name.
    fn set_field(&mut self, name: &str, value: f64) -> Result<()>;
}

/// A hyperparameter field type: stored in state dicts as an f64.
pub(crate) trait HyperValue: Copy {
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

impl HyperValue for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}

impl HyperValue for bool {
    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
}

/// Defines an options struct (pub fields with defaults) and its [`Hyper`]
/// implementation. `momentum: field` names the field schedules cycle, or
/// `momentum: none`.
macro_rules! hyper_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty = $default:expr, )*
        }
        momentum: $mom:ident
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name { $( $field: $default, )* }
            }
        }

        impl $crate::Hyper for $name {
            fn lr(&self) -> f64 {
                self.lr
            }
            fn set_lr(&mut self, lr: f64) {
                self.lr = lr;
            }
            fn weight_decay(&self) -> f64 {
                self.weight_decay
            }
            fn set_weight_decay(&mut self, weight_decay: f64) {
                self.weight_decay = weight_decay;
            }
            fn momentum(&self) -> Option<f64> {
                hyper_struct!(@get self $mom)
            }
            fn set_momentum(&mut self, momentum: f64) -> tessera_tensor::Result<()> {
                hyper_struct!(@set self momentum $mom $name)
            }
            fn fields(&self) -> Vec<(&'static str, f64)> {
                vec![$( (stringify!($field), $crate::hyper::HyperValue::to_f64(self.$field)), )*]
            }
            fn set_field(&mut self, name: &str, value: f64) -> tessera_tensor::Result<()> {
                match name {
                    $( stringify!($field) => self.$field = $crate::hyper::HyperValue::from_f64(value), )*
                    _ => {
                        return Err(tessera_tensor::Error::arg(
                            "set_field",
                            format!("{} has no field {name:?}", stringify!($name)),
                        ))
                    }
                }
                Ok(())
            }
        }
    };
    (@get $s:ident none) => { None };
    (@get $s:ident $f:ident) => { Some($s.$f) };
    (@set $s:ident $m:ident none $name:ident) => {{
        let _ = $m;
        Err(tessera_tensor::Error::arg(
            "set_momentum",
            format!("{} has no momentum to set (use cycle_momentum = false)", stringify!($name)),
        ))
    }};
    (@set $s:ident $m:ident $f:ident $name:ident) => {{
        $s.$f = $m;
        Ok(())
    }};
}

pub(crate) use hyper_struct;
