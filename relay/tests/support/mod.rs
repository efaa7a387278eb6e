pub mod klm_listener;
